"""ModelServer (labswarm/serve/server.py) without HTTP, on a real model, real files and a real worker process: a
file alone in flight is computed in the server's own thread (from memory, or from a file when over
IN_MEMORY_BYTES), one that arrives beside it in a worker process; all answer labswarm predict's probabilities, a
bad file fails its row alone, and no upload is left behind."""

from __future__ import annotations

import asyncio
import io
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from labswarm.predict import predict
from labswarm.serve.server import IN_MEMORY_BYTES, ModelServer, Upload
from labswarm.serve.settings import ServeSettings
from labswarm.serve.sources import FileModel


def _upload(path: Path) -> Upload:
    data = path.read_bytes()
    return Upload(path.name, io.BytesIO(data), len(data))


def _waited(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_lone_file_is_computed_in_the_server_and_one_beside_it_in_a_worker(model: Path, tmp_path: Path) -> None:
    """~5-20 s: the second file starts the worker process (the feature libraries' imports)."""
    data = model.parents[2] / "data"
    first, second = data / "low" / "low_1.wav", data / "noise" / "noise_3.wav"
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    y, sr = sf.read(first, dtype="float64")
    big = tmp_path / "big.wav"  # 64-bit samples: over IN_MEMORY_BYTES, written to a file before it is decoded
    sf.write(big, np.tile(y, -(-IN_MEMORY_BYTES // (8 * len(y))) + 1), sr, subtype="DOUBLE")
    assert big.stat().st_size > IN_MEMORY_BYTES
    expected = {Path(p.path).name: p.to_dict()["probabilities"] for p in predict(model, [first, second, big])}
    server = ModelServer(FileModel(model, "three"), ServeSettings(workers=1))
    entered, gate = threading.Event(), threading.Event()
    try:
        served = server.model_now("three", None) or server.model("three", None)
        alone = asyncio.run(server.predict(served, [_upload(first)]))
        bad = asyncio.run(server.predict(served, [_upload(corrupt)]))
        assert server.alone == 1 and not server.features.pids  # no worker process (the corrupt file: its header)
        shutil.rmtree(server._folder())  # a /tmp cleaner: the next upload written to a file makes it again
        small = asyncio.run(server.predict(served, [_upload(first)]))
        assert not server._folder().exists()  # decoded from memory: nothing written
        large = asyncio.run(server.predict(served, [_upload(big)]))
        assert server._folder().is_dir() and server.alone == 3
        shutil.rmtree(server._folder())

        forward = served.batched.forward

        def gated(x: np.ndarray) -> np.ndarray:  # the lone file's pass waits here while the second one arrives
            entered.set()
            assert gate.wait(120)
            return forward(x)

        served.batched.forward = gated

        async def side_by_side() -> list[list[dict[str, Any]]]:
            lone = asyncio.ensure_future(server.predict(served, [_upload(first)]))
            await asyncio.to_thread(_waited, entered.is_set, 60, "the lone file's forward pass")
            beside = asyncio.ensure_future(server.predict(served, [_upload(second)]))
            await asyncio.to_thread(_waited, lambda: server.features.pids, 120, "the worker's features")
            gate.set()
            return [await lone, await beside]

        lone_again, beside = asyncio.run(side_by_side())
        folder = server._folder()
        _waited(lambda: not any(folder.iterdir()), 60, "each file removed once computed")
    finally:
        gate.set()
        server.close()
    assert server.alone == 4 and len(server.features.pids) == 1  # the second file's features: the worker's
    for row in (alone[0], small[0], large[0], lone_again[0], beside[0]):
        assert row["status"] == 200 and row["error"] is None, row
        assert row["probabilities"] == pytest.approx(expected[row["path"]], rel=0, abs=1e-6)
    assert large[0]["windows"] > 1 and beside[0]["path"] == second.name
    assert served.batched.passes == 4 + -(-large[0]["windows"] // 8)  # the batch block: 8 windows a pass
    assert bad[0]["status"] == 422 and bad[0]["error"].startswith("AudioError: corrupt.wav"), bad
    assert str(server._uploads) not in bad[0]["error"]
    assert server._uploads is not None and not server._uploads.exists()  # removed with the server


def test_a_lone_clients_next_file_is_computed_on_the_event_loop(model: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """~1-3 s (no worker process): ``here`` (labswarm serve's routes give the request's connection) computes a
    file on the event loop only when the request before it came on the same connection and no other request is in
    progress, and the file is short; the rows are those of the upload threads (probabilities, a corrupt file's
    422 naming it)."""
    from labswarm.serve import server as module

    clip = model.parents[2] / "data" / "low" / "low_1.wav"  # 1 s
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    expected = predict(model, [clip])[0].to_dict()["probabilities"]
    server = ModelServer(FileModel(model, "three"), ServeSettings(workers=1))
    threads: list[str] = []
    try:
        served = server.model("three", None)
        forward = served.batched.forward

        def traced(x: np.ndarray) -> np.ndarray:
            threads.append(threading.current_thread().name)
            return forward(x)

        served.batched.forward = traced
        one, other = ("127.0.0.1", 50001), ("127.0.0.1", 50002)

        async def requests() -> list[dict[str, Any]]:
            rows = []
            for file, connection, in_progress in ((clip, one, 0), (clip, one, 0), (corrupt, one, 1),
                                                  (clip, other, 1), (clip, other, 2), (clip, None, 0),
                                                  (clip, None, 0), (clip, other, 0), (clip, other, 1)):
                server.requests = in_progress  # the routes count the requests in progress, this one included
                rows += await server.predict(served, [_upload(file)], here=connection)
            monkeypatch.setattr(module, "HERE_MAX_S", 0.5)  # a longer file: in a thread
            rows += await server.predict(served, [_upload(clip)], here=other)
            return rows

        main = threading.current_thread().name
        rows = asyncio.run(requests())
    finally:
        server.close()
    # the first of its connection: a thread; its second: here; the corrupt file: here (its 422, no pass); another
    # connection: a thread; two in progress: a thread; no connection (the manager): threads; a connection after
    # none: a thread, its second here; over HERE_MAX_S: a thread
    assert [t == main for t in threads] == [False, True, False, False, False, False, False, True, False], threads
    assert server.here == 2 and server.alone == 9 and not server.features.pids, (server.here, server.alone)
    for row in rows[:2] + rows[3:]:
        assert row["status"] == 200 and row["probabilities"] == pytest.approx(expected, rel=0, abs=1e-6), row
    assert rows[2]["status"] == 422 and rows[2]["error"].startswith("AudioError: corrupt.wav"), rows[2]
    assert str(server._uploads) not in rows[2]["error"]
