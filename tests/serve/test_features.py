"""The prediction endpoint's feature processes (labswarm/serve/features.py) and the hand-over of their arrays to the
batched forward pass (labswarm/serve/server.py, forward_when_ready): a real worker process, real audio files; a
worker's end with its server's process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import psutil
import pytest
import soundfile as sf

from labswarm.config.experiment import parse_experiment
from labswarm.errors import AudioError
from labswarm.predict import Inputs
from labswarm.serve.batching import BatchedModel
from labswarm.serve.features import FeaturePool, WorkerError
from labswarm.serve.server import forward_when_ready

SR = 8000


def _inputs(folder: Path) -> Inputs:
    """The inputs of a 1-s-segment, 16-band log-mel experiment (batches of 2 windows)."""
    (folder / "data").mkdir()
    (folder / "data" / "labels.csv").write_text("path,label\n")
    experiment = parse_experiment({
        "name": "serve-features", "seed": 0,
        "dataset": {"root": str(folder / "data"), "sample_rate": SR, "segment": {"start": 0.0, "duration": 1.0}},
        "transformations": [{"name": "identity"}], "features": [{"name": "mel", "n_mels": 16}],
        "store": {"root": str(folder / "store")},
        "pipeline": [{"name": "source"}, {"name": "features"}, {"name": "batch", "size": 2}],
        "model": {"name": "cnn", "input": "mel"}, "training": {"epochs": 1}})
    return Inputs(experiment, "mel", ("low", "high"))


def _row_sums(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1).sum(1, keepdims=True).astype(np.float64)


@pytest.mark.slow
def test_a_worker_process_computes_the_same_inputs_hands_them_to_the_model_and_is_replaced_when_it_dies(
        tmp_path: Path) -> None:
    """~5-15 s: a worker process starts twice (the feature libraries' imports)."""
    inputs = _inputs(tmp_path)
    rng = np.random.default_rng(0)
    one, three, corrupt = tmp_path / "one.wav", tmp_path / "three.wav", tmp_path / "corrupt.wav"
    sf.write(one, (0.3 * rng.standard_normal(SR)).astype(np.float32), SR)
    sf.write(three, (0.3 * rng.standard_normal(int(3.2 * SR))).astype(np.float32), SR)  # 3 windows: 2 + 1
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    expected = {path: inputs(path) for path in (one, three)}
    before = set(multiprocessing.active_children())
    pool = FeaturePool(1)
    model = BatchedModel(_row_sums, name="test")
    try:
        futures = {path: pool.submit(inputs, path) for path in (one, three)}
        for path, future in futures.items():
            got = future.result(120)
            assert [a.shape for a in got] == [e.shape for e in expected[path]]
            assert all(a.dtype == np.float32 and np.array_equal(a, e) for a, e in zip(got, expected[path], strict=True))
        assert [len(a) for a in expected[three]] == [2, 1]
        assert pool.pids and os.getpid() not in pool.pids  # computed in another process
        with pytest.raises(WorkerError, match=r"^AudioError: .*corrupt\.wav") as failed:  # its type and words
            pool.submit(inputs, corrupt).result(120)
        with pytest.raises(AudioError) as local:
            inputs(corrupt)
        assert str(failed.value) == f"AudioError: {local.value}"

        parts = forward_when_ready(model, pool.submit(inputs, three)).result(120)
        assert [p.ravel().tolist() for p in parts] == [_row_sums(e).ravel().tolist() for e in expected[three]]
        with pytest.raises(WorkerError, match=r"corrupt\.wav"):  # no pass for a file whose features failed
            forward_when_ready(model, pool.submit(inputs, corrupt)).result(120)
        assert model.rows == 3 and model.passes in (1, 2)  # the two arrays of three.wav alone (maybe one pass)

        first = set(pool.pids)
        for child in set(multiprocessing.active_children()) - before:  # the worker dies (as killed for memory)
            os.kill(child.pid, signal.SIGKILL)
        answers, broken = [], 0
        for _ in range(2):  # a file sent before the death is seen fails with it; the next gets a new worker
            try:
                answers.append(pool.submit(inputs, one).result(120))
                break
            except BrokenProcessPool:
                broken += 1
        assert answers and np.array_equal(answers[0][0], expected[one][0]), f"{broken} broken"
        assert pool.restarts == 1 and pool.pids - first
    finally:
        model.close()
        pool.close()


@pytest.mark.slow
def test_the_workers_end_with_a_killed_server() -> None:
    """~5-20 s: a server-like process starts a worker and is killed; its worker must not outlive it (it waits on a
    pipe whose both ends it holds: without its watch on the parent it stayed, seen after killed bench servers)."""
    code = ("import sys; from labswarm.serve.features import FeaturePool; pool = FeaturePool(1); "
            "print(*pool.warm(), flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as server:  # its pipes closed on leaving
        try:
            line = server.stdout.readline() if server.stdout else ""
            workers = [psutil.Process(int(pid)) for pid in line.split()]
            assert workers and all(w.is_running() and w.ppid() == server.pid for w in workers), line
        finally:
            server.kill()
            server.wait(60)
    _, alive = psutil.wait_procs(workers, timeout=60)
    for worker in alive:
        worker.kill()
    assert not alive, f"workers {[w.pid for w in alive]} outlived their killed server"
