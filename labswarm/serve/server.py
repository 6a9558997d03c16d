"""The prediction endpoint's work, independent of HTTP: uploaded files in, one result per file out.

Each file goes as it would through ``labswarm predict`` (:class:`labswarm.predict.Predictor`: the same decoding,
windows, features and mean of the windows' softmax), with limits checked first: a file over ``max_file_bytes``
or ``max_duration_s`` (read from its header, before decoding) is refused in its row with 413, one that cannot be
decoded or classified with 422, and the other files are answered. A file alone in flight is computed in an
upload thread of the server (features, then its forward pass: no hand-over to a worker process, no arrays pickled
back, no turn of the model's thread; setting ``compute_alone``); files that arrive while another is in flight
have their features computed by ``workers`` processes (:mod:`labswarm.serve.features`) and their forward passes
batched with the other requests' (:mod:`labswarm.serve.batching`). Such a file goes from its features straight
to the model's queue (no turn of the event loop between them): under load every hand-over between threads waits
for a core. An upload of at most :data:`IN_MEMORY_BYTES` (a 10-s clip is 441 KB) is decoded from memory, as
libsndfile reads a file (no file written, its header read once more, then removed: ~0.2 ms a request); it is
written to a file only for a worker process. Files are written to one folder of the server's (a folder per request
cost ~0.15 ms to make and remove on the quiet machine, up to ~5 ms under load, on the event loop), each file
removed once computed.

A lone file is computed in an upload thread; in ``labswarm serve`` (:meth:`ModelServer.predict`'s ``here``), a
short one of a client that waits for each answer before its next request (the same connection twice in a row, no
other request in progress) is computed on the event loop instead: two thread hand-overs fewer (to the thread and
back, each a wake-up of a sleeping thread and the interpreter's lock passed: ~0.5 ms quiet, 2026-11-26 spans), and
the body's bytes computed on the core that received them. The manager never does (it would stall its other routes
for the file's computation). Under load the event loop computing it answered later (2026-11-26, load 5-6: p50 19-24
ms against 14-18 ms; 2026-11-27, load 6-8: 27-34 against 20-21 ms, the same CPU: a thread woken for the file is
favoured by the kernel's scheduler over one that runs on, as the in-process baseline itself, 31-34 ms at that
load). With the bench's processes served before any other (``chrt -f 10``, 2026-11-27): one client's p50 1.07-1.13x
the in-process call on the loop against 1.17-1.20x in the thread, in the same rounds. The goal is a quiet machine's
(docs/benchmarks/training.md); ``LABSWARM_PREDICT_LONE_ON_LOOP=false`` keeps the thread.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import threading
import uuid
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
from threadpoolctl import ThreadpoolController

from labswarm.audio.io import audio_info
from labswarm.auth.tokens import User
from labswarm.predict import Prediction
from labswarm.serve.batching import BatchedModel
from labswarm.serve.cache import ModelCache, Served
from labswarm.serve.features import FeaturePool, WorkerError
from labswarm.serve.handoff import Handoff
from labswarm.serve.settings import ServeSettings
from labswarm.serve.sources import ModelSource

#: An upload of at most this many bytes is decoded from memory (its file object, as Starlette holds a multipart
#: part of up to 1 MiB in memory; the one-file body is spooled alike), without writing it to a file first; a larger
#: one is written to a file of the server's folder and decoded from there.
IN_MEMORY_BYTES = 1024 * 1024

#: The longest lone file computed on the event loop (``labswarm serve``: :meth:`ModelServer.predict`'s ``here``),
#: in seconds of audio: ~30 ms of the loop for the bench's model (15 ms a 10-s clip); a longer one in a thread.
HERE_MAX_S = 20.0


@dataclass
class Upload:
    """One uploaded file: its name as sent, its bytes (a readable file object) and its size in bytes; ``whole``
    false: a body read no further than past ``max_file_bytes`` (chunked, no ``Content-Length``), ``size`` the bytes
    read then, ``file`` none of them (refused with 413)."""

    name: str
    file: IO[bytes]
    size: int
    whole: bool = True


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
        # checking uploads' durations, computing a lone one, writing the others to files for the workers
        self.uploads = Handoff(max(4, self.settings.workers), "labswarm-upload")
        self.alone = 0  # files computed in the server's own process (none other in flight)
        self.here = 0  # of those, on the event loop (:meth:`predict` given ``here``)
        self.on_loop = False  # the routes give ``here`` (``labswarm serve`` with ``lone_on_loop``)
        self.requests = 0  # prediction requests in progress (the routes count them, from before their bodies)
        self._last: object = None  # the connection of the last request that reached :meth:`predict`
        self._flight = threading.Lock()
        self._busy = 0  # files between their duration check and their last forward pass
        self._limits: ThreadpoolController | None = None
        self._uploads: Path | None = None

    def _load(self, key: str) -> Served:
        predictor = self.source.load(key, threads=self.settings.threads)
        # the server's threads run only passes and features: torch's threads set once in each, not per pass
        return Served(predictor, BatchedModel(functools.partial(predictor.forward, restore=False),
                                              self.settings.max_batch, key, self.settings.runners))

    def model(self, key: str, user: User | None) -> Served:
        """The model of ``key`` if ``user`` may use it (checked on every call), loaded once and kept.

        Raises:
            NotFound, Conflict: see :meth:`ModelSource.check`; NotFound also when it has no model.
            CheckpointError: the model file is not usable.
        """
        self.source.check(key, user)
        return self.cache.get(key)

    def model_now(self, key: str, user: User | None) -> Served | None:
        """:meth:`model` without blocking: the model when its source checks without I/O
        (:attr:`ModelSource.instant`) and it is loaded, else ``None`` (call :meth:`model` in a thread).

        Raises:
            NotFound, Conflict: see :meth:`ModelSource.check`.
        """
        if not self.source.instant:
            return None
        served = self.cache.peek(key)
        if served is not None:
            self.source.check(key, user)
        return served

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

    async def predict(self, served: Served, uploads: list[Upload], top: int | None = None,
                      here: object = None) -> list[dict[str, Any]]:
        """One result per upload, in order: ``{path, label, probabilities, windows, error, status}`` (the
        ``labswarm predict --json`` row of the file, ``path`` the name it was sent with, and the row's HTTP
        status: 200, 413 or 422; 422 also when the worker computing its features died).

        ``here``: the request's connection (its client address), given where a lone file may be computed on the
        event loop (``labswarm serve``): one file of at most :data:`IN_MEMORY_BYTES` and :data:`HERE_MAX_S`
        seconds, the only request in progress (:attr:`requests`), on the connection of the request before it (a
        client waiting for each answer before its next request: another client's request reaching the server
        next goes to a thread, as do those arriving beside one), with no other file in flight, is computed on the
        event loop, sparing the hand-overs to the upload thread and back; any other as without ``here``."""
        folder = self._folder()
        if len(uploads) == 1:  # no task to gather
            upload, path = uploads[0], folder / f"{uuid.uuid4().hex}{_suffix(uploads[0].name)}"
            same, self._last = here is not None and here == self._last, here
            return [await self._file(served, upload, path, top, same and self.requests <= 1)]
        self._last = here
        return list(await asyncio.gather(*(self._file(served, upload, folder / f"{uuid.uuid4().hex}"
                                                      f"{_suffix(upload.name)}", top) for upload in uploads)))

    def _folder(self) -> Path:
        """The server's folder of uploaded files (made on the first upload, removed by :meth:`close`; made again
        by the upload thread where it went): each file is removed once computed; a folder a request would spend
        ~0.1-5 ms making and removing (the file system under load), and no file system call on the event loop."""
        if self._uploads is None:
            with self._flight:
                if self._uploads is None:
                    self._uploads = Path(tempfile.mkdtemp(prefix="labswarm-upload-"))
        return self._uploads

    async def _file(self, served: Served, upload: Upload, path: Path, top: int | None,
                    here: bool = False) -> dict[str, Any]:
        try:
            if upload.size > self.settings.max_file_bytes:
                size = f"{upload.size} bytes" if upload.whole else f"at least {upload.size} bytes"
                raise Refused(413, f"{size}: over the limit of {self.settings.max_file_bytes} (setting "
                                   "predict_max_file_bytes, LABSWARM_PREDICT_MAX_FILE_BYTES)")
            done = self._begin(served, upload, path, here=True) if here and upload.size <= IN_MEMORY_BYTES else None
            # else one wake-up of the loop when the file is computed, in a thread or a worker (handoff.py)
            parts = done.result() if done is not None else await self.uploads.settle(self._start, served, upload,
                                                                                       path)
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
        """:meth:`_begin` in an upload thread."""
        return cast(Future[list[np.ndarray]], self._begin(served, upload, path))

    def _begin(self, served: Served, upload: Upload, path: Path, here: bool = False
               ) -> Future[list[np.ndarray]] | None:
        """Check the upload's duration, then compute it: here when no other file is in flight
        (:meth:`_compute_alone`), else its features in a worker process and, once computed, its arrays on the
        model's queue (batched with the other requests'). An upload of at most :data:`IN_MEMORY_BYTES` is read
        from memory, written to ``path`` only for a worker process; a larger one is written to ``path`` first.
        The future gives the softmax of each of its input arrays (float64 ``(n, n_classes)``), or the first error.
        ``path`` is removed once computed. Runs in an upload thread; ``here``: on the event loop, for an upload
        of at most :data:`IN_MEMORY_BYTES`, computed only if alone and at most :data:`HERE_MAX_S` long (else
        ``None``, nothing done: hand it to a thread; a refused or undecodable file raises as in a thread)."""
        memory = upload.file if upload.size <= IN_MEMORY_BYTES else None
        counted = written = False
        try:
            if memory is None:
                written = True
                _write(upload.file, path)
            frames, rate = audio_info(path, memory)  # AudioError: not decodable (422)
            seconds = frames / rate
            if seconds > self.settings.max_duration_s:
                raise Refused(413, f"{seconds:.1f} s of audio: over the limit of {self.settings.max_duration_s:g} "
                                   "s (setting predict_max_duration_s, LABSWARM_PREDICT_MAX_DURATION_S)")
            with self._flight:
                alone = not self._busy and self.settings.compute_alone
                if here and not (alone and seconds <= HERE_MAX_S):
                    return None
                self._busy += 1
            counted = True
            if memory is not None and not alone:  # a worker process reads a file
                memory.seek(0)
                written = True
                _write(memory, path)
        except BaseException:
            if counted:
                self._landed(path, written)
            elif written:
                path.unlink(missing_ok=True)
            raise
        if alone:
            try:
                return self._compute_alone(served, path, memory, here)
            finally:
                self._landed(path, written)
        try:
            passed = forward_when_ready(served.batched, self.features.submit(served.predictor.inputs_of, path))
        except BaseException:  # no worker took it (the pool shut down, a spawn failed): not in flight any more
            self._landed(path)
            raise
        passed.add_done_callback(lambda _: self._landed(path))
        return passed

    def _landed(self, path: Path, written: bool = True) -> None:
        """A file computed (or failed): no longer in flight, removed if it was ``written``."""
        with self._flight:
            self._busy -= 1
        if written:
            path.unlink(missing_ok=True)

    def _compute_alone(self, served: Served, path: Path, data: IO[bytes] | None, here: bool = False
                       ) -> Future[list[np.ndarray]]:
        """The file's features (from ``data`` if given, else from ``path``) and forward passes in this thread,
        its maths libraries on one thread meanwhile (as a feature worker's): the lone request spares the
        hand-overs to a worker process, the arrays pickled back, and the model's thread."""
        done: Future[list[np.ndarray]] = Future()
        done.set_running_or_notify_cancel()
        if self._limits is None:
            self._limits = ThreadpoolController()
        try:
            with self._limits.limit(limits=1):
                arrays = served.predictor.inputs_of(path, data)
            done.set_result([served.batched.run(x) for x in arrays])
        except Exception as exc:
            done.set_exception(exc)
        self.alone += 1
        self.here += here
        return done

    def close(self) -> None:
        """Close the cached models, the feature processes and the upload threads."""
        self.cache.close()
        self.features.close()
        self.uploads.close()
        if self._uploads is not None:
            shutil.rmtree(self._uploads, ignore_errors=True)


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


def _write(data: IO[bytes], path: Path) -> None:
    """``data`` (from where it stands) written to ``path``, the folder made again if it went (a /tmp cleaner,
    systemd-tmpfiles after days idle)."""
    try:
        handle = open(path, "wb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        handle = open(path, "wb")  # noqa: SIM115
    with handle:
        shutil.copyfileobj(data, handle)


def _suffix(name: str) -> str:
    """The file name's extension if it is a plain one (``.wav``, ``.flac``), else none: the format is read from the
    bytes, the extension only helps the decoders that look at it."""
    suffix = Path(name).suffix.lower()
    return suffix if suffix[1:].isalnum() and len(suffix) <= 6 else ""
