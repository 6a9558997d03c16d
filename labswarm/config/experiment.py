"""The experiment configuration: a pydantic model loaded from YAML.

An experiment names its dataset, the transformations every clip is expanded with (identity included when
wanted), the feature extractors, and the feature store::

    name: music_speech_noise
    seed: 0
    dataset: {root: ../data/demo, labels: labels.csv, sample_rate: 22050, segment: {start: 0.0, duration: 10.0}}
    transformations: [{name: identity}, {name: pitch_shift, semitones: 2}]
    features: [{name: mel, n_mels: 128}, {name: mfcc, n_mfcc: 20}]
    store: {root: ../data/store}
    # optional: training on the features
    pipeline: [{name: source}, {name: shuffle}, {name: features}, {name: batch, size: 32}, {name: prefetch}]
    model: {name: cnn, input: mel}
    training: {epochs: 6, validation: 0.2}

Unknown keys and bad values raise :class:`~labswarm.errors.ConfigError` with the dotted path of each field
(``transformations.1.semitones``) and the reason. Relative paths in a YAML file are relative to that file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from labswarm.audio.features.base import EXTRACTORS, FeatureConfig
from labswarm.audio.transforms.base import TRANSFORMATIONS, TransformationConfig
from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError, format_loc
from labswarm.plugin import PluginConfig, configs_of, field_errors, validate_plugin_spec, validate_plugin_specs
from labswarm.registry import BLOCKS, MODELS, STORAGES
from labswarm.storage.base import StorageConfig
from labswarm.storage.cache import DEFAULT_CACHE_BYTES

#: Experiment names become queue names (``labswarm.<name>``) and folder names: keep them to this pattern.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SegmentConfig(_Strict):
    """Which part of each clip is used.

    Attributes:
        start: segment start in seconds.
        duration: segment length in seconds; ``None`` uses the clip to its end.
        pad: zero-pad clips that end before the segment does, instead of failing them.
    """

    start: float = Field(0.0, ge=0.0)
    duration: float | None = Field(10.0, gt=0.0)
    pad: bool = False


class DatasetConfig(_Strict):
    """Where the samples come from: a folder of audio files and a labels CSV (``path,label[,source]``).

    Attributes:
        root: folder the CSV's paths are relative to.
        labels: the labels CSV, relative to ``root`` unless absolute.
        sample_rate: rate in Hz every clip is resampled to before transformations and features.
        segment: the part of each clip used.
    """

    root: Path
    labels: Path = Path("labels.csv")
    sample_rate: int = Field(22050, ge=1000, le=192000)
    segment: SegmentConfig = SegmentConfig()

    @property
    def labels_path(self) -> Path:
        """The labels CSV's full path."""
        return self.labels if self.labels.is_absolute() else self.root / self.labels


class StoreConfig(_Strict):
    """The feature store.

    Attributes:
        root: a local or shared (NFS) directory, the same path on every worker; with ``remote``, the folder of
            each machine's local cache of the store.
        remote: the store in a storage (``{name: s3, endpoint: URL, bucket: ..., prefix: ...}``; credentials come
            from the environment or a file, never from here, see :mod:`labswarm.storage.s3`): the workers write
            there and the trainers read it through the cache in ``root``. ``None``: the store is ``root``.
        cache_bytes: the bound of the cache in ``root`` in bytes, least recently used out (0: no cache, every
            read a request); default 10 GiB. Only with ``remote``.
    """

    root: Path
    remote: SerializeAsAny[StorageConfig] | None = None  # issue 24: the feature store on object storage
    cache_bytes: int = Field(DEFAULT_CACHE_BYTES, ge=0)

    @field_validator("remote", mode="before")
    @classmethod
    def _remote(cls, value: Any) -> Any:
        return value if value is None or isinstance(value, StorageConfig) else \
            validate_plugin_spec(value, STORAGES, "remote")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without ``remote`` and ``cache_bytes`` while they are unset, so that the fingerprints of experiments
        written before they existed do not change."""
        data = handler(self)
        if self.remote is None and self.cache_bytes == DEFAULT_CACHE_BYTES:
            data.pop("remote", None)
            data.pop("cache_bytes", None)
        return data


class ExperimentConfig(_Strict):
    """One experiment: dataset × transformations → features in a store.

    Attributes:
        name: lower-case identifier (``[a-z0-9][a-z0-9_.-]*``, at most 64 characters).
        description: free text.
        seed: seed of everything random (per-sample seeds derive from it); what training draws follows
            ``training.seed`` where set (:attr:`training_seed`).
        dataset: see :class:`DatasetConfig`.
        transformations: every clip yields one sample per transformation, in this order.
        features: the extractors computed for each sample; their ``output`` names must be unique.
        store: see :class:`StoreConfig`.
        pipeline: the training data pipeline, a list of blocks (:mod:`labswarm.pipeline.blocks`): a ``source``
            first, a ``features`` and a ``batch`` block, and a ``prefetch`` block last if any.
        model: the model trained on the features (:mod:`labswarm.train.models`; installed packages add theirs),
            ``{name: ..., **its parameters}`` or ``{code: FILE.py:Class, ...}`` (a network from a file); its
            ``input`` is one of the features' output names.
        training: how to train (:class:`~labswarm.config.training.TrainingConfig`); ``None``: features only.
    """

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    seed: int = Field(0, ge=0)
    dataset: DatasetConfig
    transformations: list[SerializeAsAny[TransformationConfig]] = Field(
        default_factory=lambda: [TransformationConfig(name="identity")], min_length=1
    )
    features: list[SerializeAsAny[FeatureConfig]] = Field(min_length=1)
    store: StoreConfig
    pipeline: list[SerializeAsAny[PluginConfig]] = Field(default_factory=lambda: _default_pipeline(),
                                                         validate_default=True)
    model: SerializeAsAny[PluginConfig] | None = None
    training: TrainingConfig | None = None

    @field_validator("transformations", mode="before")
    @classmethod
    def _transformations(cls, value: Any) -> Any:
        specs = validate_plugin_specs(value, TRANSFORMATIONS, "transformations")
        if repeat := _first_repeat(json.dumps(s.model_dump(mode="json"), sort_keys=True) for s in specs):
            index, earlier = repeat
            raise ValueError(f"item {index} repeats item {earlier} ({specs[index].name}): each must differ")
        return specs

    @field_validator("features", mode="before")
    @classmethod
    def _features(cls, value: Any) -> Any:
        specs = configs_of(validate_plugin_specs(value, EXTRACTORS, "features"), FeatureConfig, EXTRACTORS)
        if repeat := _first_repeat(s.output_name for s in specs):
            index, earlier = repeat
            raise ValueError(
                f"item {index} has the same output name {specs[index].output_name!r} as item {earlier}: "
                "set `output` to tell them apart"
            )
        return specs

    @field_validator("pipeline", mode="before")
    @classmethod
    def _pipeline(cls, value: Any, info: ValidationInfo) -> Any:
        specs = validate_plugin_specs(value, BLOCKS, "pipeline")
        names = [s.name for s in specs]
        if not names or names[0] != "source":
            raise ValueError("the first block must be a `source`")
        for required in ("features", "batch"):
            if required not in names:
                raise ValueError(f"a `{required}` block is missing")
        if "prefetch" in names[:-1]:
            raise ValueError("`prefetch` can only be the last block")
        if repeat := _first_repeat(n for n in names if n != "shuffle"):
            raise ValueError(f"item {repeat[0]} repeats the `{names[repeat[0]]}` block of item {repeat[1]}")
        if names.index("features") > names.index("batch"):
            raise ValueError("the `features` block must come before the `batch` block (a batch holds features)")
        outputs = [f.output_name for f in info.data.get("features") or []]
        features = specs[names.index("features")]
        if outputs and (unknown := sorted(set(_block_outputs(features) or ()) - set(outputs))):
            raise ValueError(f"item {names.index('features')} (features) reads {unknown}, which the experiment does "
                             f"not compute; its feature outputs are {outputs}")
        return specs

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if isinstance(value, Mapping) and "code" in value and "name" not in value:  # {code: my_net.py:Net}
            value = {"name": "code", **value}
        spec = value if isinstance(value, PluginConfig) else validate_plugin_spec(value, MODELS, "model")
        outputs = [f.output_name for f in info.data.get("features") or []]
        read = [o for b in info.data.get("pipeline") or [] if b.name == "features" and (o := _block_outputs(b))]
        if not outputs and not read:
            return spec
        wanted = _model_input(spec)
        if outputs and wanted not in outputs:
            raise ValueError(f"input {wanted!r} is not a feature output; the features are {outputs}")
        if read and wanted not in read[0]:
            raise ValueError(f"input {wanted!r} is not among the outputs the pipeline's features block reads "
                             f"({read[0]})")
        return spec

    @field_validator("training")
    @classmethod
    def _training(cls, value: TrainingConfig | None, info: ValidationInfo) -> TrainingConfig | None:
        if value is not None and info.data.get("model") is None and "model" not in _failed(info):
            raise ValueError("training needs a `model` section (e.g. {name: cnn, input: mel})")
        return value

    @property
    def training_seed(self) -> int:
        """The seed of what training draws (sample order, crops, initial weights, dropout): ``training.seed``, else
        the experiment's :attr:`seed` (the default, as before ``training.seed`` existed). The features and the
        validation split keep :attr:`seed`."""
        if self.training is not None and self.training.seed is not None:
            return self.training.seed
        return self.seed

    def fingerprint(self) -> str:
        """A 16-hex-digit hash of the whole configuration (canonical JSON), e.g. to name trained models."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def resolve_paths(self, base: Path) -> ExperimentConfig:
        """A copy whose relative dataset and store paths are made absolute against ``base``."""
        dataset = self.dataset.model_copy(update={"root": _absolute(self.dataset.root, base)})
        store = self.store.model_copy(update={"root": _absolute(self.store.root, base)})
        transformations = [
            t.model_copy(update={"file": str(_absolute(Path(file), base))}) if (file := getattr(t, "file", None)) else t
            for t in self.transformations
        ]
        model = self.model
        if model is not None and isinstance(code := getattr(model, "code", None), str):  # FILE.py:Class
            file, _, attr = code.rpartition(":")
            model = model.model_copy(update={"code": f"{_absolute(Path(file), base)}:{attr}"})
        return self.model_copy(update={"dataset": dataset, "store": store, "transformations": transformations,
                                       "model": model})


@runtime_checkable
class _FeaturesBlockConfig(Protocol):
    """The ``features`` block's config (:class:`labswarm.pipeline.blocks.features.FeaturesConfig`; the pipeline
    is a layer above this one)."""

    @property
    def outputs(self) -> list[str] | None: ...


@runtime_checkable
class _ModelConfig(Protocol):
    """A model's config (:class:`labswarm.train.models.base.ModelConfig`; the models are a layer above)."""

    @property
    def input(self) -> str: ...


def _block_outputs(spec: PluginConfig) -> list[str] | None:
    """The ``outputs`` of the ``features`` block ``spec``."""
    if not isinstance(spec, _FeaturesBlockConfig):
        raise ValueError(f"the config of block {spec.name!r} ({type(spec).__name__}) has no `outputs`")
    return spec.outputs


def _model_input(spec: PluginConfig) -> str:
    """The ``input`` of the model ``spec``."""
    if not isinstance(spec, _ModelConfig):
        raise ValueError(f"the config of model {spec.name!r} ({type(spec).__name__}) has no `input`")
    return spec.input


def _failed(info: ValidationInfo) -> set[str]:
    """Fields validated before this one that failed (absent from ``info.data``)."""
    return {name for name in ("model",) if name not in info.data}


def _default_pipeline() -> list[dict[str, Any]]:
    """The pipeline an experiment gets when it names none: every sample of the split, shuffled, its features
    read from the store, batches of 32, two producer processes."""
    return [{"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 32},
            {"name": "prefetch", "producers": 2}]


def _first_repeat(keys: Iterable[str]) -> tuple[int, int] | None:
    """``(index, index of the earlier equal key)`` of the first key that repeats one before it, else None."""
    seen: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in seen:
            return index, seen[key]
        seen[key] = index
    return None


def _absolute(path: Path, base: Path) -> Path:
    return path if path.is_absolute() else (base / path).resolve()


def _unquoted(problem: str) -> str:
    """A YAML parser's problem with the text it quotes from the document (``found undefined alias 'x'``) left
    out, its grammar tokens (``'<stream end>'``) and single characters (``','``, ``'\\t'``) kept: no error
    message quotes the content of a file."""
    return re.sub(r"'([^']*)'|\"([^\"]*)\"",
                  lambda m: m[0] if len(m[0]) <= 4 or re.fullmatch(r".<[a-z ]+>.", m[0]) else "(...)", problem)


def yaml_mapping(data: Mapping[str, Any] | str, source: str | None = None) -> Mapping[str, Any]:
    """The mapping ``data`` is, or that its YAML (JSON is YAML) text holds at the top level.

    Raises:
        ConfigError: a YAML syntax error (its line and column, none of its text), or a top level that is not a
            mapping.
    """
    if isinstance(data, str):
        try:
            data = yaml.safe_load(data)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            problem = _unquoted(str(getattr(exc, "problem", None) or "syntax error"))
            raise ConfigError([("", f"invalid YAML: {where}{problem}")], source=source) from None
    if not isinstance(data, Mapping):
        raise ConfigError([("", f"expected a mapping at the top level, got {type(data).__name__}")], source=source)
    return data


def parse_experiment(data: Mapping[str, Any] | str, *, base_dir: Path | None = None, source: str | None = None):
    """Validate an experiment from a mapping or YAML/JSON text.

    Args:
        data: the configuration, as a mapping or as YAML (JSON is YAML) text.
        base_dir: relative paths are resolved against it; ``None`` keeps them as written.
        source: where the text came from, for error messages.

    Returns:
        The validated :class:`ExperimentConfig`.

    Raises:
        ConfigError: YAML syntax error (its line and column, none of its text), or every invalid field with its
            dotted path and the reason.
    """
    data = yaml_mapping(data, source)
    try:
        config = ExperimentConfig.model_validate(dict(data))
    except ValidationError as exc:
        # an unknown key: the closest known one suggested (issue 29)
        raise ConfigError([(format_loc(loc), why) for loc, why in field_errors(exc, ExperimentConfig)],
                          source=source) from None
    return config.resolve_paths(base_dir) if base_dir is not None else config


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Load and validate an experiment YAML file; relative paths are relative to the file's folder.

    Raises:
        ConfigError: the file cannot be read, or it is invalid (see :func:`parse_experiment`).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([("", f"cannot read {path}: {exc.strerror or exc}")], source=str(path)) from exc
    except UnicodeDecodeError:  # its message quotes the offending bytes
        raise ConfigError([("", f"{path} is not UTF-8 text")], source=str(path)) from None
    return parse_experiment(text, base_dir=path.resolve().parent, source=str(path))
