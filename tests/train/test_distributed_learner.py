"""The local runner of one distributed learner (labswarm/train/distributed/learner.py) ends without the
interpreter's teardown once its outcome is known (gloo's and torch's teardown once aborted a learner under load:
"terminate called without an active exception", -6), its output flushed and its exit code kept: 2 for a
labswarm error or a usage error, 0 for --help. A real process; an atexit handler registered before the module
runs marks a teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN = ("import atexit, runpy, sys; atexit.register(print, 'TEARDOWN RAN', flush=True); sys.argv[0] = 'learner'; "
       "runpy.run_module('labswarm.train.distributed.learner', run_name='__main__', alter_sys=True)")


def _learner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120)


def test_the_learner_ends_without_teardown_and_keeps_its_exit_codes(tmp_path: Path) -> None:
    missing = _learner(str(tmp_path / "missing.yml"), "--home", str(tmp_path), "--framework", '{"name": "allreduce"}')
    assert missing.returncode == 2, missing.stderr
    assert "learner failed:" in missing.stderr and "missing.yml" in missing.stderr
    bad = _learner(str(tmp_path / "missing.yml"), "--home", str(tmp_path), "--framework", "allreduce")
    assert bad.returncode == 2 and "--framework" in bad.stderr and "not JSON" in bad.stderr, bad.stderr
    shown = _learner("--help")
    assert shown.returncode == 0 and "--framework" in shown.stdout  # stdout (a pipe: block-buffered) flushed
    for done in (missing, bad, shown):
        assert "TEARDOWN RAN" not in done.stdout + done.stderr
