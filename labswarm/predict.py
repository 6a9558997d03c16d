"""Classify new audio files with a trained model (``labswarm predict``).

A model file (written by :meth:`labswarm.train.trainer.Trainer.fit`, by ``labswarm train`` or a training job)
carries the experiment's whole configuration, so a file's features are computed exactly as the workers computed
the training samples: :meth:`labswarm.pipeline.features.FeaturesBlock.compute` under the ``identity``
transformation (load, mono, segment, resample to the experiment's rate, the model's input extractor), then
framed as the trainer frames its evaluation inputs: the experiment's ``batch`` block in evaluation mode
(:meth:`labswarm.pipeline.blocks.batch.Batcher.collate`: ``eval_frames`` centred crops, or whole clips).
Nothing is read from or written to the experiment's feature store.

Long files: a file is cut into consecutive windows of the experiment's segment, ``[start, start + duration)``,
``[start + duration, start + 2 duration)``, ... as many as fit wholly in the file (a tail shorter than a segment
is left out); each window is classified as the trainer evaluates a clip, and the file's class probabilities are
the mean of its windows' (its label their argmax). A file shorter than one segment is one window, zero-padded
when the experiment's segment says ``pad: true``; otherwise its row fails with the reason, as the trainer would
have failed such a clip. A segment without ``duration`` makes the whole file from ``start`` one window.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np
from pydantic import ValidationError

from labswarm.audio.io import END_TOLERANCE_S, audio_info
from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import LabswarmError
from labswarm.pipeline.base import Block, Context
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import Sample
from labswarm.storage.base import Storage, StorageConfig
from labswarm.store.store import FeatureStore
from labswarm.train.checkpoint import CheckpointError

#: The transformation a file to classify goes through: none (the clean clip).
IDENTITY: dict[str, Any] = {"name": "identity"}


@dataclass(frozen=True)
class Prediction:
    """One file's classification.

    Attributes:
        path: the file, as given.
        label: the most probable class; ``None`` when the file failed.
        probabilities: class -> probability in [0, 1], summing to 1, in the model's class order (empty when the
            file failed): the mean over the file's windows of the model's softmax.
        windows: segments of the file that were classified (0 when it failed).
        error: why the file could not be classified (``"AudioError: x.wav: cannot decode audio (...)"``), else
            ``None``.
    """

    path: str
    label: str | None
    probabilities: dict[str, float] = field(default_factory=dict)
    windows: int = 0
    error: str | None = None

    def top(self, k: int | None = None) -> list[tuple[str, float]]:
        """The ``k`` most probable classes (all when ``None``) as ``(class, probability)``, most probable first."""
        ranked = sorted(self.probabilities.items(), key=lambda item: -item[1])
        return ranked if k is None else ranked[:k]

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """JSON-ready ``{path, label, probabilities, windows, error}``; ``top`` keeps the ``top`` most probable
        classes in ``probabilities`` (most probable first)."""
        return {"path": self.path, "label": self.label, "probabilities": dict(self.top(top)),
                "windows": self.windows, "error": self.error}


class _NoStorage(Storage):
    """A storage that keeps nothing: prediction computes features without touching any feature store."""

    name: ClassVar[str] = "none"

    def _describe(self, full: str) -> str:
        return f"prediction's features ({full})"

    def _put_bytes(self, full: str, data: bytes) -> None:
        return None

    def _get_bytes(self, full: str) -> bytes:
        raise self._missing(full)

    def _put_file(self, full: str, path: Path) -> None:
        return None

    def _read_into(self, full: str, handle: IO[bytes]) -> None:
        raise self._missing(full)

    def _exists(self, full: str) -> bool:
        return False

    def _list(self, folder: str) -> Iterator[str]:
        return iter(())

    def _sizes(self, folder: str) -> Iterator[tuple[str, int]]:
        return iter(())

    def _delete_many(self, fulls: list[str]) -> None:
        return None

    def _reachable(self) -> None:
        return None


@dataclass
class _Window:
    """What :meth:`Batcher.collate` reads of an item: the sample, its label index (unused here), its features."""

    sample: Sample
    features: dict[str, np.ndarray]
    label: int = 0


class Inputs:
    """The model inputs of audio files under an experiment: what :class:`Predictor` feeds its model, without the
    model (the serving endpoint computes them in other processes: an instance pickles as its three arguments and
    is rebuilt there).

    Args:
        experiment: the experiment the model was trained on.
        input: the feature the model reads (``mel``, ``mfcc``, ...).
        classes: the model's class labels (the collation's context; no label is read).

    Raises:
        ValueError: the experiment has no feature ``input``.
    """

    def __init__(self, experiment: ExperimentConfig, input: str, classes: tuple[str, ...]) -> None:
        self.experiment, self.input, self.classes = experiment, input, classes
        nothing = FeatureStore(storage=_NoStorage(StorageConfig(name="none")))
        self._features = FeaturesBlock(experiment, store=nothing)
        if input not in {ex.output_name for ex in self._features.extractors}:
            raise ValueError(f"the model reads feature {input!r}, which its experiment lacks")
        spec = next(s for s in experiment.pipeline if s.name == "batch")  # the config requires one
        self._batcher: Any = Block.from_spec(spec.model_dump(mode="json"))
        self._context = Context(experiment=experiment, classes=classes, split="all", train=False)

    def __reduce__(self) -> tuple[type[Inputs], tuple[ExperimentConfig, str, tuple[str, ...]]]:
        return Inputs, (self.experiment, self.input, self.classes)

    def windows(self, path: str | Path, data: IO[bytes] | None = None) -> list[Sample]:
        """The samples (``identity`` transformation) of the windows of ``path`` that are classified (see the
        module docstring); ``data``: the file's bytes, read instead of the file (an upload held in memory), ``path``
        then only its name.

        Raises:
            AudioError: the file is missing, unreadable, or holds no audio.
        """
        segment = self.experiment.dataset.segment
        n_frames, native_sr = audio_info(path, data)
        seconds = n_frames / native_sr
        count = 1
        if segment.duration is not None:
            count = max(1, math.floor((seconds - segment.start + END_TOLERANCE_S) / segment.duration))
        return [Sample(id=f"{path}@{i}", path=str(path), label="", source=str(path),
                       start=segment.start + i * (segment.duration or 0.0), duration=segment.duration,
                       transformation=IDENTITY, seed=0) for i in range(count)]

    def __call__(self, path: str | Path, data: IO[bytes] | None = None) -> list[np.ndarray]:
        """The model's inputs for the windows of one file, as :meth:`Predictor.probabilities` feeds them to the
        model: the windows collated by the experiment's ``batch`` block in evaluation mode, at most its ``size`` at
        a time. ``data``: the file's bytes, read instead of the file (see :meth:`windows`).

        Returns:
            float32 arrays ``(n, *input_shape)``, one per batch of windows (``n`` at most the batch size); their
            rows add up to the file's window count. Rows are independent: each may go through the model in any
            batch of rows of the same shape (:meth:`Predictor.forward`), as the serving endpoint batches several
            requests.

        Raises:
            AudioError, TransformError, FeatureError: the file cannot be loaded or its features computed.
        """
        samples = self.windows(path, data)
        size = self._batcher.config.size
        out = []
        for first in range(0, len(samples), size):  # at most a batch of windows in memory at once
            items = [_Window(s, self._features.compute(s, only={self.input}, data=data))
                     for s in samples[first:first + size]]
            out.append(self._batcher.collate(items, self._context, 0).features[self.input])  # no randomness
        return out


class Predictor:
    """A trained model ready to classify files; build it once for many calls.

    Args:
        model_path: a model file written by the trainer (``<home>/models/<experiment>-<hash>.pt``, or a training
            job's ``model.pt``).
        threads: torch's intra-op threads while the model runs (the caller's count is restored afterwards).
            Default 1: a file is a small batch, and on the shared 2-core machine 2 threads made a file 2-3x
            slower (0.34-0.55 s vs 0.16-0.24 s per 10-s clip, side by side, load 8).

    Attributes:
        classes: the class labels, in the model's output order.
        experiment: the experiment the model was trained on (from the model file).
        input: the feature the model reads (``mel``, ``mfcc``, ...).
        inputs_of: its :class:`Inputs` (the model's inputs for a file, without the model).
        meta: the model file's metadata (:func:`~labswarm.train.trainer.load_model`), e.g. its last ``metrics``.

    Raises:
        CheckpointError: the file is missing, unreadable, truncated, not a labswarm model file, or lacks the
            experiment configuration prediction needs.
        ValueError: ``threads`` below 1.
        ImportError: torch is not installed.
    """

    def __init__(self, model_path: str | Path, threads: int = 1) -> None:
        from labswarm.train.trainer import load_model

        if threads < 1:
            raise ValueError(f"threads: at least 1, got {threads}")

        path = Path(model_path)
        try:
            self.model, meta = load_model(path)
        except ImportError:
            raise
        except Exception as exc:  # torch.load raises many kinds of errors on foreign bytes (IndexError, ...)
            raise CheckpointError(_unreadable(path, exc)) from None
        self.meta: dict[str, Any] = meta
        try:
            self.classes: tuple[str, ...] = tuple(meta["classes"])
            self.input: str = meta["input"]
            self.experiment = ExperimentConfig.model_validate(meta["config"])
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError, ValidationError,
                LabswarmError) as exc:  # a dict of another shape, weights of another model, a foreign config
            raise CheckpointError(f"{path} is not a usable labswarm model file: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}") from None
        try:
            self.inputs_of = Inputs(self.experiment, self.input, self.classes)
        except ValueError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        self.threads = threads

    def windows(self, path: str | Path) -> list[Sample]:
        """:meth:`Inputs.windows` of ``path``."""
        return self.inputs_of.windows(path)

    def inputs(self, path: str | Path) -> list[np.ndarray]:
        """:meth:`Inputs.__call__` of ``path``: the model's inputs for its windows."""
        return self.inputs_of(path)

    def forward(self, inputs: np.ndarray, restore: bool = True) -> np.ndarray:
        """The model's softmax over a batch of inputs (rows of :meth:`inputs`), with :attr:`threads` torch threads.

        Args:
            inputs: float32 ``(n, *input_shape)``.
            restore: set the calling thread's torch threads back to their count afterwards (a caller's own
                thread); false: leave them at :attr:`threads` (a thread that runs only passes, as the serving
                endpoint's: set on its first pass and not again; torch, built with OpenMP, keeps the count per
                thread and gives it to threads started later).

        Returns:
            float64 ``(n, n_classes)``, each row summing to 1.
        """
        import torch

        threads = torch.get_num_threads()
        try:
            if threads != self.threads:
                torch.set_num_threads(self.threads)
            with torch.no_grad():
                logits = self.model(torch.from_numpy(inputs))
            return torch.softmax(logits.double(), dim=1).numpy()
        finally:
            if restore and threads != self.threads:
                torch.set_num_threads(threads)

    def probabilities(self, path: str | Path) -> tuple[np.ndarray, int]:
        """Class probabilities of one file and its number of windows.

        Returns:
            float64 array ``(n_classes,)`` summing to 1 (the mean of the windows' softmax), and the window count.

        Raises:
            AudioError, TransformError, FeatureError: the file cannot be loaded or its features computed.
        """
        total, windows = np.zeros(len(self.classes)), 0
        for batch in self.inputs(path):
            total += self.forward(batch).sum(0)
            windows += len(batch)
        return total / windows, windows

    def prediction(self, path: str | Path, probabilities: np.ndarray, windows: int) -> Prediction:
        """The :class:`Prediction` of ``path`` from its mean probabilities ``(n_classes,)`` and window count."""
        return Prediction(str(path), self.classes[int(np.argmax(probabilities))],
                          {c: float(v) for c, v in zip(self.classes, probabilities, strict=True)}, windows)

    def predict_file(self, path: str | Path) -> Prediction:
        """Classify one file; never raises for a problem of the file (the reason is in :attr:`Prediction.error`)."""
        try:
            p, windows = self.probabilities(path)
        except Exception as exc:  # a library failure on one file fails that file, not the others
            return Prediction(str(path), None, error=f"{type(exc).__name__}: {exc}")
        return self.prediction(path, p, windows)

    def predict(self, paths: Sequence[str | Path]) -> list[Prediction]:
        """:meth:`predict_file` for each path, in order."""
        return [self.predict_file(p) for p in paths]


def _unreadable(path: Path, exc: Exception) -> str:
    """Why a model file cannot be read, in one line (torch's own messages run over many)."""
    if isinstance(exc, CheckpointError) and exc.__cause__ is None:  # load_model's own words
        return str(exc)
    if not path.exists():
        return f"{path}: no such model file"
    if path.is_dir():
        return f"{path} is a folder, not a model file"
    if not zipfile.is_zipfile(path):  # what torch.save writes
        return f"{path} is not a labswarm model file (not a complete file of torch.save: another format, or truncated)"
    cause = exc.__cause__ or exc
    first = str(cause).strip().splitlines()
    return f"{path} is not a labswarm model file ({type(cause).__name__}: {first[0][:300] if first else ''})"


def predict(model_path: str | Path, paths: Sequence[str | Path]) -> list[Prediction]:
    """Classify audio files with a trained model.

    Args:
        model_path: a model file written by the trainer (see :class:`Predictor`).
        paths: audio files (any format libsndfile decodes; any rate and channel count: mixed to mono and
            resampled to the experiment's rate).

    Returns:
        One :class:`Prediction` per path, in order; a file that cannot be classified (missing, corrupt, shorter
        than the experiment's segment) has ``label`` ``None`` and its reason in ``error``.

    Raises:
        CheckpointError: ``model_path`` is not a readable labswarm model file.
        ImportError: torch is not installed.
    """
    return Predictor(model_path).predict(paths)
