"""A local worker ends with the launcher that started it (labswarm/deploy/lifeline.py), real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from labswarm.deploy.lifeline import PARENT_ENV, end_with_parent
from labswarm.errors import ConfigError

#: A "worker": binds itself to the launcher its environment names, then waits (it ends only through the lifeline).
WORKER = ("import sys, time; from labswarm.deploy.lifeline import end_with_parent; "
          "end_with_parent(grace_s=1.0); print('watching', flush=True); time.sleep(600)")
#: A "launcher": starts the worker bound to itself, prints the worker's pid, then waits to be killed.
LAUNCHER = ("import os, subprocess, sys, time; from labswarm.deploy.lifeline import lifeline_env; "
            f"w = subprocess.Popen([sys.executable, '-c', {WORKER!r}], env={{**os.environ, **lifeline_env()}}, "
            "start_new_session=True); print(w.pid, flush=True); time.sleep(600)")


def wait_gone(pid: int, deadline: float) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_worker_ends_when_its_launcher_is_killed() -> None:
    worker = 0
    with subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True) as launcher:
        try:
            assert launcher.stdout is not None
            worker = int(launcher.stdout.readline())
            assert psutil.pid_exists(worker)
            launcher.send_signal(signal.SIGKILL)
            launcher.wait(30)
            assert wait_gone(worker, 60), "the worker outlived its killed launcher"
        finally:
            launcher.kill()
            if worker and psutil.pid_exists(worker):
                os.kill(worker, signal.SIGKILL)


def test_a_worker_whose_named_launcher_is_not_its_parent_ends_at_once() -> None:
    """The launcher died before the worker started watching and its pid now names another live process: the
    worker must not watch that stranger (it would never end)."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as stranger:
        try:
            with subprocess.Popen([sys.executable, "-c", WORKER], env={**os.environ, PARENT_ENV: str(stranger.pid)},
                                  stdout=subprocess.DEVNULL) as worker:
                try:
                    worker.wait(60)  # raises TimeoutExpired when the worker is still watching the stranger
                    assert worker.returncode == -signal.SIGTERM  # its lifeline's warm shutdown
                finally:
                    worker.kill()
        finally:
            stranger.kill()


def test_no_launcher_named_watches_nothing_and_a_bad_one_is_refused() -> None:
    assert end_with_parent({}) is None
    with pytest.raises(ConfigError, match=PARENT_ENV):
        end_with_parent({PARENT_ENV: "not-a-pid"})
