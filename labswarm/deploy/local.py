"""Workers as local processes: ``labswarm worker`` subprocesses on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from labswarm.deploy.base import Launcher


class LocalLauncher(Launcher):
    """Runs N ``labswarm worker`` processes for one experiment.

    Args:
        experiment: the experiment name, or several: each worker then consumes all their queues.
        manager_url: the manager's URL, passed to each worker.
        broker_url: broker override; ``None`` lets workers use the manager's.
        concurrency: pool processes per worker.
        token: the manager's API token, passed through the environment.
        log_dir: folder for each worker's stdout/stderr (``worker-<i>.log``); ``None`` discards them.
    """

    def __init__(self, experiment: str | list[str], manager_url: str, *, broker_url: str | None = None,
                 concurrency: int = 1, token: str | None = None, log_dir: Path | None = None) -> None:
        self.experiment = experiment
        self.manager_url = manager_url
        self.broker_url = broker_url
        self.concurrency = concurrency
        self.token = token
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen] = []
        self._started = 0

    def command(self) -> list[str]:
        """The command line of one worker."""
        names = [self.experiment] if isinstance(self.experiment, str) else list(self.experiment)
        cmd = [sys.executable, "-m", "labswarm.cli", "worker"]
        for name in names:
            cmd += ["--experiment", name]
        cmd += ["--manager", self.manager_url, "--concurrency", str(self.concurrency)]
        if self.broker_url:
            cmd += ["--broker", self.broker_url]
        return cmd

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ)
        if self.token:
            env["LABSWARM_API_TOKEN"] = self.token
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        if self.log_dir is None:
            self._started += 1
            return subprocess.Popen(self.command(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # the child gets its own copy of the descriptor; ours is closed once it is started
        with open(self.log_dir / f"worker-{self._started}.log", "ab") as out:
            self._started += 1
            return subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def start(self, workers: int) -> None:
        self.scale(workers)

    def scale(self, workers: int) -> None:
        self.processes = [p for p in self.processes if p.poll() is None]
        while len(self.processes) < workers:
            self.processes.append(self._spawn())
        while len(self.processes) > workers:
            self._terminate([self.processes.pop()], 30.0)

    def stop(self, timeout: float = 30.0) -> None:
        procs, self.processes = self.processes, []
        self._terminate(procs, timeout)

    @staticmethod
    def _terminate(procs: list[subprocess.Popen], timeout: float) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    @property
    def workers(self) -> int:
        return sum(p.poll() is None for p in self.processes)
