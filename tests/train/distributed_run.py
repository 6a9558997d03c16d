"""Runs one attempt of a distributed training job as real local processes, as the job's deployer would: a fresh
coordinator (with a checkpoint's cursor restored into it), 2 learners with :func:`plan_attempt`'s environments
(the parameter-server shards, where the framework has them, are the caller's: they outlive the attempt)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from labswarm.train.distributed.launch import JobCoordinator, plan_attempt


def run_attempt(number: int, argv: Callable[[int], list[str]], log_dir: Path, learners: int = 2,
                cursor: dict[str, Any] | None = None, timeout_s: float = 240.0,
                framework: dict[str, Any] | None = None,
                ps_addresses: Sequence[tuple[str, int]] = ()) -> dict[int, int]:
    """Run attempt ``number`` of a job of ``framework`` (default allreduce; one with a parameter server needs the
    running shards' ``ps_addresses``): rank ``r`` runs ``argv(r)``, its output in
    ``log_dir/learner-<number>-<r>.log``. Returns the exit codes by rank (killed after ``timeout_s`` s)."""
    coordinator = JobCoordinator()
    if cursor is not None:
        coordinator.restore_cursor(cursor)
    procs: dict[int, subprocess.Popen] = {}
    try:
        plans = plan_attempt(framework or {"name": "allreduce"}, learners, number, ("127.0.0.1", coordinator.port),
                             ps_addresses, log_dir / "ps" if ps_addresses else None)
        for plan in (p for p in plans if p.kind == "learner"):
            with open(log_dir / f"learner-{number}-{plan.index}.log", "ab") as out:
                procs[plan.index] = subprocess.Popen(
                    argv(plan.index), stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, **plan.env, "OMP_NUM_THREADS": "1"})
        return {rank: proc.wait(timeout=timeout_s) for rank, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        del coordinator


def logs(log_dir: Path) -> str:
    """The tails of the learners' logs (for an assertion's message)."""
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(log_dir.glob("learner-*.log")))
