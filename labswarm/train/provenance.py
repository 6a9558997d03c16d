"""What a trained model was made of, so that a training identical to a finished one is not repeated (issue 29,
item 4): the hash of its configuration, the fingerprint of its data and the version of the code.

* **configuration**: a 16-hex-digit BLAKE2b hash of the canonical JSON of what decides the model (the experiment;
  for a training job, its resolved manifest without what does not: name, description, priority, restart policy,
  results store).
* **data**: a 16-hex-digit BLAKE2b hash of the labels CSV's bytes and, for every audio file it lists and every
  file a transformation reads (noise), its path, size in bytes and modification time in nanoseconds: a file
  rewritten, even with the same bytes, counts as changed. The audio is not read (a quick check, as ``make`` and
  ``rsync`` do: ~3 ms per 1,000 files), so a change that keeps a file's size and time is not seen.
* **files**: a 16-hex-digit BLAKE2b hash of the bytes of the files the configuration names by path and whose
  content decides the model: a model's Python file (``model: {code: FILE.py:Class}``) and the model file a
  training starts from (``training.init_from: {model: PATH}``); editing either is another training. Modules the
  model's file imports are not followed. A missing file counts as such (the training would fail anyway).
* **code**: the labswarm distribution's version with a hash of its Python sources (an edited working tree is
  another code), and the versions of the libraries that compute the numbers (torch, numpy, librosa, scipy).

Their combination, :attr:`Provenance.key`, is what a finished training is looked up by.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.datasets.folder import read_clips
from labswarm.errors import DatasetError

#: The libraries whose versions are part of the code version (they compute the features and the model).
LIBRARIES = ("torch", "numpy", "librosa", "scipy")
#: Manifest fields that do not change the trained model: left out of a job's configuration hash.
NOT_CONFIGURATION = frozenset({"name", "description", "priority", "restart", "results_store"})


@dataclass(frozen=True)
class Provenance:
    """What a training is made of (see the module).

    Attributes:
        configuration: the configuration's hash (16 hex digits).
        data: the data fingerprint (16 hex digits).
        files: the hash of the bytes of the files the configuration names (16 hex digits; see the module).
        code: the code version, e.g. ``labswarm 0.1.0 (sources 04b2631209991e06); torch 2.13.0; numpy 2.1.3; ...``.
    """

    configuration: str
    data: str
    files: str
    code: str

    @property
    def key(self) -> str:
        """The four together as one 32-hex-digit hash: equal keys, the same training."""
        return _hash(json.dumps(asdict(self), sort_keys=True).encode(), 16)

    def as_dict(self) -> dict[str, str]:
        """``{configuration, data, files, code, key}``."""
        return {**asdict(self), "key": self.key}


def of_experiment(experiment: ExperimentConfig) -> Provenance:
    """The provenance of ``labswarm train``'s training of ``experiment`` (its whole configuration).

    Raises:
        DatasetError: the labels CSV cannot be read.
    """
    init = experiment.training.init_from if experiment.training is not None else None
    return Provenance(experiment.fingerprint(), data_fingerprint(experiment),
                      files_fingerprint(experiment, init.model if init is not None else None), code_version())


def of_job(manifest: Mapping[str, Any], experiment: ExperimentConfig) -> Provenance:
    """The provenance of a training job: its resolved ``manifest`` (the experiment inline) less
    :data:`NOT_CONFIGURATION`, ``experiment``'s data, and the files both name (the model's code; the
    ``init_from`` model of the manifest's merged training, else of the experiment's).

    Raises:
        DatasetError: the labels CSV cannot be read.
    """
    decisive = {k: v for k, v in manifest.items() if k not in NOT_CONFIGURATION}
    configuration = _hash(json.dumps(decisive, sort_keys=True, default=str).encode(), 8)
    training = manifest.get("training")
    init = training.get("init_from") if isinstance(training, Mapping) else None
    if init is None and experiment.training is not None and experiment.training.init_from is not None:
        init = {"model": experiment.training.init_from.model}
    model = init.get("model") if isinstance(init, Mapping) else None
    return Provenance(configuration, data_fingerprint(experiment), files_fingerprint(experiment, model),
                      code_version())


def data_fingerprint(experiment: ExperimentConfig) -> str:
    """The fingerprint of the data ``experiment`` trains on (see the module): 16 hex digits.

    Raises:
        DatasetError: the labels CSV cannot be read.
    """
    labels = experiment.dataset.labels_path
    digest = hashlib.blake2b(digest_size=8)
    try:
        digest.update(Path(labels).read_bytes())
    except OSError as exc:
        raise DatasetError(f"cannot read the labels file {labels}: {exc.strerror or exc}") from None
    files = [clip.path for clip in read_clips(experiment.dataset.root, labels)]
    files += sorted(str(file) for t in experiment.transformations if (file := getattr(t, "file", None)))
    for file in files:
        digest.update(_stat_line(file))
    return digest.hexdigest()


def files_fingerprint(experiment: ExperimentConfig, init_model: str | None = None) -> str:
    """The hash of the bytes of ``experiment``'s model code file (``model: {code: FILE.py:Class}``) and of the
    model file ``init_model`` a training starts from (see the module): 16 hex digits, of nothing when neither.
    Each file is named with its role and path before its bytes; one that cannot be read counts as ``missing``."""
    files = []
    code = getattr(experiment.model, "code", None)
    if isinstance(code, str):
        files.append(("model.code", code.rpartition(":")[0] or code))
    if init_model is not None:
        files.append(("training.init_from.model", init_model))
    digest = hashlib.blake2b(digest_size=8)
    for role, file in files:
        digest.update(f"{role} {file}\n".encode())
        digest.update(_file_digest(file))
    return digest.hexdigest()


def _file_digest(file: str) -> bytes:
    """The BLAKE2b digest of ``file``'s bytes (read in 1 MiB blocks), or ``b"missing"``."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return b"missing"
    return digest.digest()


@lru_cache(maxsize=1)
def code_version() -> str:
    """This process's code version (see the module); computed once per process (~20 ms)."""
    parts = [f"labswarm {_version('labswarm')} (sources {_sources_hash()})"]
    parts += [f"{name} {_version(name)}" for name in LIBRARIES]
    return "; ".join(parts)


def _sources_hash() -> str:
    """16 hex digits over the relative path and bytes of every ``.py`` file of the labswarm package."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _stat_line(file: str) -> bytes:
    """``path size mtime_ns`` of ``file`` (``path missing`` when it is gone: the training would fail anyway)."""
    try:
        st = os.stat(file)
    except OSError:
        return f"{file} missing\n".encode()
    return f"{file} {st.st_size} {st.st_mtime_ns}\n".encode()


def _hash(data: bytes, size: int) -> str:
    return hashlib.blake2b(data, digest_size=size).hexdigest()
