"""labswarm's exceptions: one root, a shallow tree.

::

    LabswarmError                 anything labswarm raises on purpose
    ├── ConfigError               an invalid experiment or setting; carries (path, reason) pairs
    ├── DatasetError              a dataset that cannot be read (labels CSV, demo-set sources)
    ├── AudioError                one audio file that cannot be loaded, decoded or segmented
    ├── TransformError            an augmentation that cannot be applied to a waveform
    ├── FeatureError              a feature extractor that cannot run on a waveform
    ├── StoreError                the feature store cannot read or write
    ├── StorageError              a job's data or results store (local folder, S3) cannot read or write
    ├── ManagerError              the manager API refused a request or cannot be reached
    ├── DeployError               the Docker engine refused or could not be reached (swarm launcher)
    ├── PublishError              the broker refused a publish for good (access, queue arguments, vhost)
    ├── NotFound                  no experiment, session or job of that name (HTTP 404)
    └── Conflict                  the request conflicts with the current state (HTTP 409)

Third-party errors are translated at the boundary (``raise AudioError(...) from exc``) so callers catch only
these. A per-sample error (``AudioError``, ``TransformError``, ``FeatureError``) fails that one sample; the
others go on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class LabswarmError(Exception):
    """Root of every error labswarm raises on purpose."""


class ConfigError(LabswarmError):
    """An invalid configuration.

    Attributes:
        errors: ``(path, reason)`` pairs; ``path`` is the dotted location in the YAML, e.g.
            ``transformations.2.semitones``, or ``""`` for the whole document.
    """

    def __init__(self, errors: Iterable[tuple[str, str]] | str, *, source: str | None = None) -> None:
        if isinstance(errors, str):
            errors = [("", errors)]
        self.errors: list[tuple[str, str]] = list(errors)
        self.source = source
        lines = [f"{path or '<root>'}: {reason}" for path, reason in self.errors]
        head = f"invalid configuration{f' in {source}' if source else ''}"
        super().__init__(head + ":\n  " + "\n  ".join(lines))


class DatasetError(LabswarmError):
    """A dataset (labels CSV, folder, demo-set sources) that cannot be read or built."""


class SampleError(LabswarmError):
    """Base of the errors that fail one sample and nothing else."""


class AudioError(SampleError):
    """An audio file that is missing, corrupt, empty, of an unsupported format, or shorter than the segment."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self) -> tuple[type[AudioError], tuple[str, str]]:
        """Pickled as its two arguments (the default, its one message, does not unpickle: a process pool's worker
        raising it broke the pool)."""
        return type(self), (self.path, self.reason)


class TransformError(SampleError):
    """A transformation (augmentation) that cannot be applied to a waveform."""


class FeatureError(SampleError):
    """A feature extractor that cannot run on a waveform."""


class StoreError(LabswarmError):
    """The feature store cannot read or write an entry."""


class StorageError(LabswarmError):
    """A training job's data or results store (a local folder, an S3-compatible object store) refused an
    operation, could not be reached, or was given an invalid key. The message names the store and the key."""


class StorageRefused(StorageError):
    """The store refused an operation for a reason that trying again does not change: no such bucket, credentials
    missing or refused, access denied. Not retried (:mod:`labswarm.store.uploads`), unlike a transient failure."""


class StoreRefused(StoreError):
    """The feature store refused a batch's writes for good (every failed write a :class:`StorageRefused`): the
    samples that wrote them fail with the store's reason instead of being published again (a worker's task)."""


class ManagerError(LabswarmError):
    """The manager API answered with an error, or could not be reached.

    Attributes:
        status: the HTTP status code, or ``None`` when the manager could not be reached.
        detail: the manager's explanation (a string, or the list of field errors of a 422).
    """

    def __init__(self, message: str, *, status: int | None = None, detail: object = None) -> None:
        self.status = status
        self.detail = detail
        super().__init__(message)


def format_loc(loc: Sequence[str | int]) -> str:
    """Join a pydantic error location into the dotted YAML path used by :class:`ConfigError`."""
    return ".".join(str(part) for part in loc)


class DeployError(LabswarmError):
    """A launcher could not start, scale or remove workers: the Docker engine refused the request, could not be
    reached, or the docker SDK is not installed. The message names the service and the engine's explanation."""


class BrokerError(LabswarmError):
    """The broker refused the manager's connection or could not be reached when a session starts (a wrong
    password, a missing vhost, the server down): the manager's configuration or the platform, not the request.
    The message names the broker (password masked) and the broker's reason; HTTP 502."""


class PublishError(LabswarmError):
    """The broker refused to take a session's messages for a reason publishing again cannot cure: access refused
    (403), a queue declared with other arguments (406 ``PRECONDITION_FAILED``), a vhost that is missing or not
    allowed (530). The message names the queue, the broker (password masked) and the broker's reason.

    Attributes:
        queue: the queue published to.
        reason: the broker's explanation.
    """

    def __init__(self, queue: str, broker: str, reason: str) -> None:
        self.queue = queue
        self.reason = reason
        super().__init__(f"cannot publish to queue {queue} on {broker}: {reason}")


class NotFound(LabswarmError):
    """No experiment, session or job of that name / id (HTTP 404)."""


class Conflict(LabswarmError):
    """The request conflicts with the current state, e.g. a second active session of one experiment (HTTP 409)."""
