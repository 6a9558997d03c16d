"""The prediction endpoint's work, independent of HTTP: uploaded files in, one result per file out.

Each file goes as it would through ``labswarm predict`` (:class:`labswarm.predict.Predictor`: the same decoding,
windows, features and mean of the windows' softmax), with limits checked first: a file over ``max_file_bytes``
or ``max_duration_s`` (read from its header, before decoding) is refused in its row with 413, one that cannot be
decoded or classified with 422, and the other files are answered. Features are computed by a pool of
``workers`` threads; the forward passes of concurrent requests are batched (:mod:`labswarm.serve.batching`).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from labswarm.audio.io import audio_info
from labswarm.auth.tokens import User
from labswarm.predict import Prediction
from labswarm.serve.batching import BatchedModel
from labswarm.serve.cache import ModelCache, Served
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
        self.pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="labswarm-predict")

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
        """What a client needs to know of a model: classes, input feature, experiment, segment, the limits."""
        predictor = self.model(key, user).predictor
        segment = predictor.experiment.dataset.segment
        limits = self.settings
        return {"model": key, "classes": list(predictor.classes), "input": predictor.input,
                "experiment": predictor.experiment.name, "sample_rate": predictor.experiment.dataset.sample_rate,
                "segment": {"start": segment.start, "duration": segment.duration, "pad": segment.pad},
                "limits": {"max_file_bytes": limits.max_file_bytes, "max_duration_s": limits.max_duration_s,
                           "max_files": limits.max_files}}

    async def predict(self, served: Served, uploads: list[Upload], top: int | None = None
                      ) -> list[dict[str, Any]]:
        """One result per upload, in order: ``{path, label, probabilities, windows, error, status}`` (the
        ``labswarm predict --json`` row of the file, ``path`` the name it was sent with, and the row's HTTP
        status: 200, 413 or 422)."""
        folder = Path(tempfile.mkdtemp(prefix="labswarm-upload-"))
        try:
            return list(await asyncio.gather(*(self._file(served, upload, folder / f"{i}{_suffix(upload.name)}",
                                                          top) for i, upload in enumerate(uploads))))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def _file(self, served: Served, upload: Upload, path: Path, top: int | None) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        try:
            if upload.size > self.settings.max_file_bytes:
                raise Refused(413, f"{upload.size} bytes: over the limit of {self.settings.max_file_bytes} "
                                   "(setting predict_max_file_bytes, LABSWARM_PREDICT_MAX_FILE_BYTES)")
            inputs = await loop.run_in_executor(self.pool, self._inputs, served, upload, path)
            parts = await asyncio.gather(*(asyncio.wrap_future(served.batched.submit(x)) for x in inputs))
        except Refused as exc:
            return {**Prediction(upload.name, None, error=str(exc)).to_dict(), "status": exc.status}
        except Exception as exc:  # as labswarm predict: a file that cannot be classified fails its row
            reason = f"{type(exc).__name__}: {exc}".replace(str(path), upload.name)
            return {**Prediction(upload.name, None, error=reason).to_dict(), "status": 422}
        windows = sum(len(p) for p in parts)
        mean = np.sum([p.sum(0) for p in parts], axis=0) / windows
        return {**served.predictor.prediction(upload.name, mean, windows).to_dict(top), "status": 200}

    def _inputs(self, served: Served, upload: Upload, path: Path) -> list[np.ndarray]:
        """In a worker thread: write the upload to ``path``, check its duration, compute its model inputs."""
        with open(path, "wb") as out:
            shutil.copyfileobj(upload.file, out)
        frames, rate = audio_info(path)  # AudioError: not decodable (422)
        seconds = frames / rate
        if seconds > self.settings.max_duration_s:
            raise Refused(413, f"{seconds:.1f} s of audio: over the limit of {self.settings.max_duration_s:g} s "
                               "(setting predict_max_duration_s, LABSWARM_PREDICT_MAX_DURATION_S)")
        return served.predictor.inputs(path)

    def close(self) -> None:
        """Close the cached models and the feature threads."""
        self.cache.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def _suffix(name: str) -> str:
    """The file name's extension if it is a plain one (``.wav``, ``.flac``), else none: the format is read from the
    bytes, the extension only helps the decoders that look at it."""
    suffix = Path(name).suffix.lower()
    return suffix if suffix[1:].isalnum() and len(suffix) <= 6 else ""
