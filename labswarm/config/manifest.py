"""The training-job manifest: a pydantic model loaded from YAML.

::

    name: msn-cnn                     # the job's name (same pattern as experiment names)
    description: CNN on the demo set
    experiment: music_speech_noise    # a registered experiment, or an inline experiment mapping
    training: {epochs: 3}             # overrides of the experiment's training settings
    learners: 1                       # 2 or more with a distributed framework
    resources: {cpus: 2, gpus: 0, memory_mb: 4096}      # per learner
    framework: {name: labswarm}       # or {name: command, command: [...], metrics: {jsonl: metrics.jsonl}},
                                      # or {name: downpour, n_push: 2} ... (labswarm.config.frameworks)
    ps_shards: 1                      # parameter-server processes (sandblaster, downpour, easgd only)
    restart: {max_restarts_platform: 3, max_restarts_user: 0, backoff_s: 1, backoff_max_s: 60}
    priority: 0
    results_store: {name: local, path: ../results}      # or {name: s3, endpoint: ..., bucket: ..., prefix: ...}

Unknown keys and bad values raise :class:`~labswarm.errors.ConfigError` with the dotted path of each field
(``restart.backoff_s``, ``framework.metrics.regex.loss``) and the reason; relative paths in a manifest file are
relative to the file. Credentials have no field anywhere (see :mod:`labswarm.storage.s3`), so neither a dump
nor an error message can show one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from labswarm.config.experiment import NAME_PATTERN, ExperimentConfig, yaml_mapping
from labswarm.config.frameworks import (
    _FRAMEWORK_TAGS,
    DISTRIBUTED_FRAMEWORKS,
    CommandFramework,
    DistributedFramework,
    Framework,
    LabswarmFramework,
    MetricsSource,
    _Strict,
    _validation_error,
)
from labswarm.config.training import TrainingConfig
from labswarm.errors import ConfigError, format_loc
from labswarm.plugin import field_errors, validate_plugin_spec
from labswarm.storage.base import STORAGES, StorageConfig

__all__ = ["DEFAULT_USER_EXIT_CODES", "DISTRIBUTED_FRAMEWORKS", "CommandFramework", "DistributedFramework",
           "Framework", "JobManifest", "LabswarmFramework", "MetricsSource", "Resources", "RestartPolicy",
           "load_manifest", "parse_manifest"]

#: Exit codes counted as the user's fault by default: 1 (an uncaught Python exception), 2 (a usage error),
#: 126 / 127 (the shell could not execute / find the command).
DEFAULT_USER_EXIT_CODES = (1, 2, 126, 127)


class Resources(_Strict):
    """What each learner is given.

    Attributes:
        cpus: CPU cores (fractions allowed: a docker ``--cpus`` limit); default 1.
        gpus: GPUs, each learner getting its own ``CUDA_VISIBLE_DEVICES``; default 0.
        memory_mb: memory limit in MiB; default 4096 (the shipped experiment's prefetch alone may take 2048).
            A local learner gets it as the resident-memory limit of a cgroup of its own where the manager
            may create one (:mod:`labswarm.deploy.cgroups`), else, without GPUs, as an address-space limit
            (``RLIMIT_AS``) plus 16 MiB per thread (:mod:`labswarm.deploy.resource_limits`).
    """

    cpus: float = Field(1.0, gt=0, le=1024)
    gpus: int = Field(0, ge=0, le=64)
    memory_mb: int = Field(4096, ge=64)


class RestartPolicy(_Strict):
    """How failed learners are restarted (each restart is a new attempt from the last checkpoint).

    Attributes:
        max_restarts_platform: restarts after platform faults (crash, hang, lost host); default 3.
        max_restarts_user: restarts after user faults (an exit code in ``user_exit_codes``); default 0: a bug
            does not fix itself.
        backoff_s: seconds before the first restart; doubled for each further one.
        backoff_max_s: the longest wait between restarts, in seconds (at least ``backoff_s``).
        user_exit_codes: exit codes that are the user's fault (1–255; see :data:`DEFAULT_USER_EXIT_CODES`);
            never retried beyond ``max_restarts_user``. Any other failure is the platform's.
    """

    max_restarts_platform: int = Field(3, ge=0, le=100)
    max_restarts_user: int = Field(0, ge=0, le=100)
    backoff_s: float = Field(1.0, ge=0, le=3600)
    backoff_max_s: float = Field(60.0, ge=0, le=86400)
    user_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: list(DEFAULT_USER_EXIT_CODES))

    @field_validator("backoff_max_s")
    @classmethod
    def _backoff_max(cls, value: float, info: ValidationInfo) -> float:
        first = info.data.get("backoff_s")
        if first is not None and value < first:
            raise ValueError(f"must be at least backoff_s ({first})")
        return value

    @field_validator("user_exit_codes")
    @classmethod
    def _unique(cls, value: list[int]) -> list[int]:
        return sorted(set(value))

    def backoff(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 for the first): ``backoff_s · 2^(restart-1)``,
        at most ``backoff_max_s``."""
        return min(self.backoff_s * 2.0 ** max(restart - 1, 0), self.backoff_max_s)


class JobManifest(_Strict):
    """A training job, as submitted.

    Attributes:
        name: lower-case identifier, the pattern of experiment names (:data:`labswarm.config.experiment.NAME_PATTERN`).
        description: free text.
        experiment: the name of a registered experiment, or an inline experiment (with ``model`` and
            ``training`` sections).
        training: overrides of the experiment's training settings (any keys of
            :class:`~labswarm.config.training.TrainingConfig`); only the keys given.
        learners: training processes: 1 with ``labswarm`` or ``command``; 2 or more with a distributed framework
            (:class:`DistributedFramework`), each taking a slot and ``resources``.
        resources: per learner (:class:`Resources`).
        framework: what runs in a learner (:class:`LabswarmFramework`, :class:`CommandFramework` or
            :class:`DistributedFramework`).
        ps_shards: parameter-server processes of a framework that needs a server (``sandblaster``, ``downpour``,
            ``easgd``; default 1 for them); rejected for the others.
        restart: :class:`RestartPolicy`.
        priority: higher runs first; equal priorities run in submission order. Default 0.
        data_store: where a ``command`` learner reads its data (a storage spec); ``None``: the experiment's
            feature store only.
        results_store: where checkpoints, the trained model, logs and metrics go (a storage spec).
    """

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    experiment: str | ExperimentConfig
    training: dict[str, Any] = Field(default_factory=dict)
    learners: int = Field(1, ge=1)
    resources: Resources = Resources()
    framework: Framework = LabswarmFramework()
    ps_shards: int | None = Field(None, ge=1, le=64)
    restart: RestartPolicy = RestartPolicy()
    priority: int = Field(0, ge=-1000, le=1000)
    data_store: SerializeAsAny[StorageConfig] | None = None
    results_store: SerializeAsAny[StorageConfig]

    @field_validator("experiment", mode="before")
    @classmethod
    def _experiment(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not re.fullmatch(NAME_PATTERN, value):
                raise ValueError(f"must be a registered experiment's name (pattern {NAME_PATTERN}) or an "
                                 "experiment mapping")
            return value
        if isinstance(value, ExperimentConfig):
            config = value
        elif isinstance(value, Mapping):
            config = ExperimentConfig.model_validate(dict(value))
        else:
            raise ValueError("must be a registered experiment's name or an experiment mapping")
        missing = [((section,), "a job's experiment needs this section") for section in ("model", "training")
                   if getattr(config, section) is None]
        if missing:
            raise _validation_error("experiment", missing)
        return config

    @field_validator("training", mode="before")
    @classmethod
    def _training(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping of training settings to override")
        try:
            checked = TrainingConfig.model_validate(dict(value))
        except ValidationError as exc:  # a misspelled key answered with the known one
            raise _validation_error("training", field_errors(exc, TrainingConfig)) from None
        return {key: getattr(checked, key) for key in value}

    @model_validator(mode="after")
    def _learners(self) -> JobManifest:
        errors: list[tuple[tuple[str | int, ...], str]] = []
        if isinstance(self.framework, DistributedFramework):
            if self.learners < 2:
                errors.append((("learners",), f"framework {self.framework.name!r} trains 2 or more learners; "
                                              "for 1, use framework {name: labswarm}"))
            elif (problem := self.framework.learners_problem(self.learners, self.ps_shards)) is not None:
                errors.append((("framework", problem[0]), problem[1]))
            if self.ps_shards is not None and not self.framework.needs_parameter_server:
                errors.append((("ps_shards",), f"framework {self.framework.name!r} has no parameter server; "
                                               "only sandblaster, downpour and easgd take ps_shards"))
        else:
            if self.learners != 1:
                errors.append((("learners",), f"framework {self.framework.name!r} runs 1 learner; for "
                                              f"{self.learners}, name a distributed framework: "
                                              f"{', '.join(DISTRIBUTED_FRAMEWORKS)}"))
            if self.ps_shards is not None:
                errors.append((("ps_shards",), "only a parameter-server framework (sandblaster, downpour, easgd) "
                                               "takes ps_shards"))
        if errors:
            raise _validation_error("manifest", errors)
        if isinstance(self.framework, DistributedFramework):  # its SINGA topology, shown in the resolved manifest
            object.__setattr__(self, "framework", self.framework.resolve(self.learners, self.ps_shards))
        return self

    @property
    def shards(self) -> int:
        """The parameter-server shards the job runs: ``ps_shards`` (default 1) for a framework that needs a server,
        else 0."""
        framework = self.framework
        if isinstance(framework, DistributedFramework) and framework.needs_parameter_server:
            return self.ps_shards or framework.ps_shards or 1
        return 0

    @field_validator("data_store", "results_store", mode="before")
    @classmethod
    def _store(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or isinstance(value, StorageConfig):
            return value
        assert info.field_name is not None, "a field validator runs for a named field"
        return validate_plugin_spec(value, STORAGES, info.field_name)

    @property
    def experiment_name(self) -> str:
        """The experiment's name, registered or inline."""
        return self.experiment if isinstance(self.experiment, str) else self.experiment.name

    def training_config(self, experiment: ExperimentConfig | None = None) -> TrainingConfig:
        """The training settings the job runs with: the experiment's, with :attr:`training` on top.

        Args:
            experiment: the registered experiment the manifest names; ``None`` for an inline one.

        Raises:
            ConfigError: no experiment to take them from, another experiment than the one named, one without a
                ``training`` section, overrides that are invalid together with it, or a distributed framework that
                cannot split the experiment's batch across the learners (``framework.batch``: ``global`` needs a
                batch size divisible by ``learners``).
        """
        config = self._experiment_config(experiment)
        if isinstance(self.framework, DistributedFramework):
            size = next((getattr(b, "size", None) for b in config.pipeline if b.name == "batch"), None)
            if size is not None and (problem := self.framework.batch_problem(self.learners, int(size))):
                raise ConfigError([problem])
        if config.training is None:
            raise ConfigError([("experiment.training", f"experiment {config.name!r} has no training section")])
        try:
            training = TrainingConfig.model_validate({**config.training.model_dump(), **self.training})
        except ValidationError as exc:
            raise ConfigError([(format_loc(("training", *loc)), why) for loc, why in field_errors(exc, TrainingConfig)]
                              ) from None
        if self.learners > 1:  # only rank 0's records hold the validation figures these read
            watched = [f"training.{f}" for f, on in (("early_stopping", training.early_stopping is not None),
                       ("schedule", training.schedule.name == "reduce_on_plateau")) if on]
            if watched:
                raise ConfigError([(watched[0], f"not yet supported with {self.learners} learners (one learner: "
                                                "a decision every learner would have to share)")])
        return training

    def resolved(self, experiment: ExperimentConfig | None = None) -> dict[str, Any]:
        """The manifest as the job runs it, JSON-ready: every default filled in and, when the experiment is known
        (inline, or given), the whole experiment inline and the merged training settings. Loads back with
        :func:`parse_manifest`. Holds no credential (the stores have no field for one).

        Args:
            experiment: the registered experiment the manifest names, to inline it.

        Raises:
            ConfigError: see :meth:`training_config`.
        """
        data = self.model_dump(mode="json")
        if experiment is not None or isinstance(self.experiment, ExperimentConfig):
            config = self._experiment_config(experiment)
            data["experiment"] = config.model_dump(mode="json")
            data["training"] = self.training_config(experiment).model_dump(mode="json")
        return data

    def resolve_paths(self, base: Path) -> JobManifest:
        """A copy whose relative paths (an inline experiment's, a local store's ``path``, a
        ``credentials_file``) are made absolute against ``base``."""
        update: dict[str, Any] = {}
        if isinstance(self.experiment, ExperimentConfig):
            update["experiment"] = self.experiment.resolve_paths(base)
        for field in ("data_store", "results_store"):
            store = getattr(self, field)
            changes = {attr: (base / value).resolve() for attr in ("path", "credentials_file")
                       if isinstance(value := getattr(store, attr, None), Path) and not value.is_absolute()}
            if changes:
                update[field] = store.model_copy(update=changes)
        return self.model_copy(update=update)

    def _experiment_config(self, experiment: ExperimentConfig | None) -> ExperimentConfig:
        if isinstance(self.experiment, ExperimentConfig):
            if experiment is not None and experiment.name != self.experiment.name:
                raise ConfigError([("experiment", f"the manifest's experiment is inline ({self.experiment.name!r})"
                                                  f", not {experiment.name!r}")])
            return self.experiment
        if experiment is None:
            raise ConfigError([("experiment", f"experiment {self.experiment!r} is registered: pass its config")])
        if experiment.name != self.experiment:
            raise ConfigError([("experiment", f"the manifest trains {self.experiment!r}, not {experiment.name!r}")])
        return experiment


def parse_manifest(data: Mapping[str, Any] | str, *, base_dir: Path | None = None,
                   source: str | None = None) -> JobManifest:
    """Validate a manifest from a mapping or YAML/JSON text.

    Args:
        data: the manifest, as a mapping or as YAML (JSON is YAML) text.
        base_dir: relative paths are resolved against it; ``None`` keeps them as written.
        source: where the text came from, for error messages.

    Returns:
        The validated :class:`JobManifest`.

    Raises:
        ConfigError: YAML syntax error, or every invalid field with its dotted path and the reason.
    """
    data = yaml_mapping(data, source)
    try:
        manifest = JobManifest.model_validate(dict(data))
    except ValidationError as exc:
        kinds = {tuple(e["loc"]): e["type"] for e in exc.errors()}
        raise ConfigError([(_yaml_path(loc, kinds.get(loc, "")), why) for loc, why in field_errors(exc, JobManifest)],
                          source=source) from None
    return manifest.resolve_paths(base_dir) if base_dir is not None else manifest


def load_manifest(path_or_text: str | Path) -> JobManifest:
    """Load and validate a manifest from a file or from YAML text.

    Args:
        path_or_text: a :class:`~pathlib.Path`, or a string: a file's path when it is one line ending in
            ``.yml``, ``.yaml`` or ``.json``, else YAML text. Relative paths in a file are relative to its folder.

    Raises:
        ConfigError: the file cannot be read, or the manifest is invalid (see :func:`parse_manifest`).
    """
    text = str(path_or_text)
    if isinstance(path_or_text, Path) or ("\n" not in text and text.strip().endswith((".yml", ".yaml", ".json"))):
        path = Path(text.strip())
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([("", f"cannot read {path}: {exc.strerror or exc}")], source=str(path)) from None
        return parse_manifest(text, base_dir=path.resolve().parent, source=str(path))
    return parse_manifest(text, source="manifest")


def _yaml_path(location: tuple[int | str, ...], kind: str) -> str:
    """The dotted YAML path of a pydantic error at ``location`` of type ``kind``: the framework's discriminator
    (a tag pydantic inserts in the location, not a key of the YAML) is dropped; an unknown framework points at
    its ``name``."""
    loc = list(location)
    if loc[:1] == ["framework"]:
        if len(loc) > 1 and loc[1] in _FRAMEWORK_TAGS:
            del loc[1]
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            loc.append("name")
    return format_loc(loc)
