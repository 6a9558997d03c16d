"""A tiny real model and task for the distributed-learner tests, and helpers to run learner processes.

The learner program is ``tests/learners/worker.py``: the tests start it as real processes with the environment
the lifecycle manager will set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LABSWARM_PS_ADDRS, ...).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The learner program the tests run.
WORKER = Path(__file__).with_name("worker.py")
#: Input features and classes of the tiny task.
N_IN, N_CLASSES = 8, 3


def tiny_model(torch: Any, seed: int = 0) -> Any:
    """An 8 → 16 → 3 MLP (no dropout, no batch norm: ranks and a single process compute the same thing)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(N_IN, 16), torch.nn.Tanh(), torch.nn.Linear(16, N_CLASSES))


def tiny_batch(torch: Any, step: int, size: int, seed: int = 0) -> tuple[Any, Any]:
    """Batch ``step`` of a learnable task: x ~ N(0, 1) ``(size, 8)``; the label is the argmax of x's first 3."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(size, N_IN, generator=g)
    return x, x[:, :N_CLASSES].argmax(1)


def start_learners(n: int, spec: Mapping[str, Any], env: Mapping[str, str], log_dir: Path,
                   ranks: Iterable[int] | None = None) -> dict[int, subprocess.Popen]:
    """Start ``worker.py`` with ``spec`` (JSON) as ``n`` ranks, each with ``env`` plus RANK / WORLD_SIZE."""
    procs = {}
    for rank in (range(n) if ranks is None else ranks):
        log = open(log_dir / f"learner-{rank}.log", "ab")  # noqa: SIM115  (closed with the process)
        procs[rank] = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **env, "RANK": str(rank), "WORLD_SIZE": str(n)})
        log.close()
    return procs


def wait_all(procs: Mapping[int, subprocess.Popen], timeout: float, log_dir: Path) -> None:
    """Wait for every process to exit 0 within ``timeout`` seconds in all; a hang or a failure fails the test
    with the learners' logs."""
    deadline = time.monotonic() + timeout
    for rank, proc in procs.items():
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"learner {rank} still running after {timeout} s\n{logs(log_dir)}") from None
        if code != 0:
            raise AssertionError(f"learner {rank} exited {code}\n{logs(log_dir)}")


def kill_all(procs: Iterable[subprocess.Popen]) -> None:
    """Kill whatever is still running (a test's ``finally``) and reap it."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def logs(log_dir: Path) -> str:
    """Every log file in ``log_dir``, for an assertion message."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(log_dir.glob("*.log")))


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    """Poll ``condition()`` until it returns a truthy value (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def start_shard(shard: int, learners: int, run_dir: Path, port: int = 0, every: int = 5) -> subprocess.Popen:
    """Start one parameter-server shard (``python -m labswarm.train.distributed.ps``) checkpointing into ``run_dir``;
    its port is written to ``run_dir/shard-<k>.port`` once it listens (read it with :func:`shard_port`)."""
    ready = run_dir / f"shard-{shard}.port"
    ready.unlink(missing_ok=True)
    with open(run_dir / f"shard-{shard}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "labswarm.train.distributed.ps", "--shard", str(shard), "--learners", str(learners),
             "--checkpoint-dir", str(run_dir / "ps"), "--checkpoint-every", str(every), "--round-timeout", "20",
             "--port", str(port), "--ready-file", str(ready)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def shard_port(shard: int, run_dir: Path, proc: subprocess.Popen, timeout: float = 60) -> int:
    """The port a shard started by :func:`start_shard` listens on (waits for it)."""
    ready = run_dir / f"shard-{shard}.port"

    def port() -> int | None:
        if proc.poll() is not None:
            raise AssertionError(f"shard {shard} exited {proc.returncode}\n{logs(run_dir)}")
        return int(ready.read_text()) if ready.exists() else None
    return wait_for(port, timeout, f"shard {shard} to listen")
