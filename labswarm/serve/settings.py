"""The prediction endpoint's settings (``LABSWARM_PREDICT_*``), read by the manager and by ``labswarm serve``."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from labswarm.threads import usable_cores


class ServeSettings(BaseSettings):
    """Limits and sizes of ``POST /v1/models/{job}/predict``; each from ``LABSWARM_PREDICT_<NAME>``.

    Attributes:
        max_file_bytes: the largest audio file answered, in bytes (64 MiB: ~6 min of 16-bit 44.1-kHz stereo
            WAV); a larger one is refused in its row with 413.
        max_duration_s: the longest audio file answered, in seconds (600); a longer one is refused in its row
            with 413, before it is decoded.
        max_files: files in one request (64); more is a 422 of the request.
        max_request_bytes: the largest request body, in bytes (256 MiB); a larger one is refused whole with 413
            before it is read (the manager's other routes keep ``max_body_bytes``).
        cache_models: trained models kept loaded at once (4), least recently used dropped first.
        max_batch: rows (windows) of one forward pass when requests are batched (64).
        workers: processes computing the features of uploaded files at once (default: the CPU cores this process
            may run on, :func:`~labswarm.threads.usable_cores`), each with one thread per maths library.
        threads: torch's intra-op threads in a forward pass (1, as ``labswarm predict``: see
            :class:`labswarm.predict.Predictor`).
        runners: forward passes of a model run at once, each by a thread of the server's process (2): requests
            queued while a pass runs go through the next free one (:class:`~labswarm.serve.batching.BatchedModel`).
            Measured on the 2-core machine (2026-11-26, bench/serve.py --requests 64 --clients 1,16, load 1.5-2.7,
            3 alternating pairs): at 16 clients the endpoint ran 1.09, 1.16, 1.04x the in-process clips/s with 2
            against 0.87, 0.96, 0.89x with 1 (16 clients / 1 client 1.80, 1.67, 1.67x against 1.36, 1.59, 1.52x);
            one client's file is computed alone, on no runner.
        compute_alone: compute a file in the server's own process when no other file is in flight (true), sparing
            the hand-overs to a worker process and back; false: always in a worker process (the server's process
            computes no features).
        lone_on_loop: ``labswarm serve`` only (the manager's other routes must not wait): a lone file of a
            client that waits for each answer before sending its next request (the same connection twice in a
            row, no other request in progress) is computed on the server's event loop, sparing two thread
            hand-overs (:meth:`labswarm.serve.server.ModelServer.predict`); false: in an upload thread.
    """

    model_config = SettingsConfigDict(env_prefix="LABSWARM_PREDICT_", extra="ignore")

    max_file_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_duration_s: float = Field(600.0, gt=0)
    max_files: int = Field(64, ge=1)
    max_request_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    cache_models: int = Field(4, ge=1)
    max_batch: int = Field(64, ge=1)
    workers: int = Field(default_factory=lambda: len(usable_cores()), ge=1)
    threads: int = Field(1, ge=1)
    runners: int = Field(2, ge=1)
    compute_alone: bool = True
    lone_on_loop: bool = True
