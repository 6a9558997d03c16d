"""The prediction endpoint's work, independent of HTTP: uploaded files in, one result per file out.

Each file goes as it would through ``labswarm predict`` (:class:`labswarm.predict.Predictor`: the same decoding,
windows, features and mean of the windows' softmax), with limits checked first: a file over ``max_file_bytes``
or ``max_duration_s`` (read from its header, before decoding) is refused in its row with 413, one that cannot be
decoded or classified with 422, and the other files are answered. Features are computed by ``workers``
processes (:mod:`labswarm.serve.features`); the forward passes of concurrent requests are batched
(:mod:`labswarm.serve.batching`). A file goes from its features straight to the model's queue (no turn of the
event loop between them): under load every hand-over between threads waits for a core.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from labswarm.audio.io import audio_info
from labswarm.auth.tokens import User
from labswarm.predict import Prediction
from labswarm.serve.batching import BatchedModel
from labswarm.serve.cache import ModelCache, Served
from labswarm.serve.features import FeaturePool, WorkerError
from labswarm.serve.settings import ServeSettings
from labswarm.serve.sources import ModelSource


@dataclass
class Upload:
    """One uploaded file: its name as sent, its bytes (a readable file object) and its size in bytes."""

    name: str
    file: IO[bytes]
    size: int


class Refused(Exception):
    """A file refused with an HTTP status (413, 422) and a reason, in its own row."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class ModelServer:
    """Serves the models of a :class:`~labswarm.serve.sources.ModelSource`, keeping the recently used ones loaded.

    Args:
        source: where models come from and who may use them.
        settings: limits and sizes (:class:`ServeSettings`).
    """

    def __init__(self, source: ModelSource, settings: ServeSettings | None = None) -> None:
        self.source = source
        self.settings = settings or ServeSettings()
        self.cache = ModelCache(self.settings.cache_models, self._load)
        self.features = FeaturePool(self.settings.workers)
        # writing uploads to files, reading their headers, removing them: short, mostly I/O
        self.files = ThreadPoolExecutor(max(4, self.settings.workers), thread_name_prefix="labswarm-upload")

    def _load(self, key: str) -> Served:
        predictor = self.source.load(key, threads=self.settings.threads)
        return Served(predictor, BatchedModel(predictor.forward, self.settings.max_batch, key))

    def model(self, key: str, user: User | None) -> Served:
        """The model of ``key`` if ``user`` may use it (checked on every call), loaded once and kept.

        Raises:
            NotFound, Conflict: see :meth:`ModelSource.check`; NotFound also when it has no model.
            CheckpointError: the model file is not usable.
        """
        self.source.check(key, user)
        return self.cache.get(key)

    def describe(self, key: str, user: User | None) -> dict[str, Any]:
        """What a client needs to know of a model: classes, input feature, experiment, segment, the limits; and
        its forward passes since it was loaded (``passes``, ``rows``: ``rows / passes`` is the mean batch)."""
        served = self.model(key, user)
        predictor = served.predictor
        segment = predictor.experiment.dataset.segment
        limits = self.settings
        return {"model": key, "classes": list(predictor.classes), "input": predictor.input,
                "experiment": predictor.experiment.name, "sample_rate": predictor.experiment.dataset.sample_rate,
                "segment": {"start": segment.start, "duration": segment.duration, "pad": segment.pad},
                "limits": {"max_file_bytes": limits.max_file_bytes, "max_duration_s": limits.max_duration_s,
                           "max_files": limits.max_files},
                "forward": {"passes": served.batched.passes, "rows": served.batched.rows}}

    async def predict(self, served: Served, uploads: list[Upload], top: int | None = None
                      ) -> list[dict[str, Any]]:
        """One result per upload, in order: ``{path, label, probabilities, windows, error, status}`` (the
        ``labswarm predict --json`` row of the file, ``path`` the name it was sent with, and the row's HTTP
        status: 200, 413 or 422; 422 also when the worker computing its features died)."""
        folder = Path(tempfile.mkdtemp(prefix="labswarm-upload-"))
        try:
            return list(await asyncio.gather(*(self._file(served, upload, folder / f"{i}{_suffix(upload.name)}",
                                                          top) for i, upload in enumerate(uploads))))
        finally:
            try:
                self.files.submit(shutil.rmtree, folder, ignore_errors=True)  # not awaited: the answer waits for none
            except RuntimeError:  # the server is closing: its threads take no more work
                shutil.rmtree(folder, ignore_errors=True)

    async def _file(self, served: Served, upload: Upload, path: Path, top: int | None) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        try:
            if upload.size > self.settings.max_file_bytes:
                raise Refused(413, f"{upload.size} bytes: over the limit of {self.settings.max_file_bytes} "
                                   "(setting predict_max_file_bytes, LABSWARM_PREDICT_MAX_FILE_BYTES)")
            started = await loop.run_in_executor(self.files, self._start, served, upload, path)
            parts = await asyncio.wrap_future(started)
        except Refused as exc:
            return {**Prediction(upload.name, None, error=str(exc)).to_dict(), "status": exc.status}
        except Exception as exc:  # as labswarm predict: a file that cannot be classified fails its row
            reason = (str(exc) if isinstance(exc, WorkerError) else f"{type(exc).__name__}: {exc}")
            reason = reason.replace(str(path), upload.name)
            return {**Prediction(upload.name, None, error=reason).to_dict(), "status": 422}
        windows = sum(len(p) for p in parts)
        mean = np.sum([p.sum(0) for p in parts], axis=0) / windows
        return {**served.predictor.prediction(upload.name, mean, windows).to_dict(top), "status": 200}

    def _start(self, served: Served, upload: Upload, path: Path) -> Future[list[np.ndarray]]:
        """In a thread: write the upload to ``path`` and check its duration; then its features go to a worker
        process and, once computed, to the model's queue. The future gives the softmax of each of its input
        arrays (float64 ``(n, n_classes)``), or the first error."""
        with open(path, "wb") as out:
            shutil.copyfileobj(upload.file, out)
        frames, rate = audio_info(path)  # AudioError: not decodable (422)
        seconds = frames / rate
        if seconds > self.settings.max_duration_s:
            raise Refused(413, f"{seconds:.1f} s of audio: over the limit of {self.settings.max_duration_s:g} s "
                               "(setting predict_max_duration_s, LABSWARM_PREDICT_MAX_DURATION_S)")
        return forward_when_ready(served.batched, self.features.submit(served.predictor.inputs_of, path))

    def close(self) -> None:
        """Close the cached models, the feature processes and the upload threads."""
        self.cache.close()
        self.features.close()
        self.files.shutdown(wait=False, cancel_futures=True)


def forward_when_ready(batched: BatchedModel, inputs: Future[list[np.ndarray]]) -> Future[list[np.ndarray]]:
    """Once ``inputs`` gives its arrays, queue each on ``batched`` (in the thread that completed ``inputs``);
    the future gives their softmax arrays in order, or the first exception (of ``inputs`` or of a pass)."""
    out: Future[list[np.ndarray]] = Future()

    def computed(done: Future[list[np.ndarray]]) -> None:
        if not out.set_running_or_notify_cancel():  # the request went away: no forward pass for it
            return
        if done.cancelled():
            out.set_exception(CancelledError())
            return
        if done.exception() is not None:
            out.set_exception(done.exception())
            return
        parts = [batched.submit(x) for x in done.result()]
        left, lock = [len(parts)], threading.Lock()

        def passed(_: Future[np.ndarray]) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            failed = next((p.exception() for p in parts if p.exception() is not None), None)
            out.set_exception(failed) if failed is not None else out.set_result([p.result() for p in parts])

        if not parts:
            out.set_result([])
        for part in parts:
            part.add_done_callback(passed)

    inputs.add_done_callback(computed)
    return out


def _suffix(name: str) -> str:
    """The file name's extension if it is a plain one (``.wav``, ``.flac``), else none: the format is read from the
    bytes, the extension only helps the decoders that look at it."""
    suffix = Path(name).suffix.lower()
    return suffix if suffix[1:].isalnum() and len(suffix) <= 6 else ""
