"""The local runner of one distributed learner (labswarm/train/distributed/learner.py) ends without the
interpreter's teardown once its outcome is known (gloo's and torch's teardown once aborted a learner under load:
"terminate called without an active exception", -6), its output flushed and its exit code kept: 2 for a
labswarm error or a usage error, 0 for --help. A real process; an atexit handler registered before the module
runs marks a teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from labswarm.train.distributed import learner

RUN = ("import atexit, runpy, sys; atexit.register(print, 'TEARDOWN RAN', flush=True); sys.argv[0] = 'learner'; "
       "runpy.run_module('labswarm.train.distributed.learner', run_name='__main__', alter_sys=True)")


def _learner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # three interpreters importing labswarm: 14-44 s at load 20-25
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


class _Ended(Exception):
    """Raised by the stand-in for ``os._exit``: carries the exit code."""


@pytest.mark.parametrize(("raised", "code", "printed"), [
    (SystemExit("a message for the user"), 1, "a message for the user"),
    (SystemExit(None), 0, ""),
    (KeyboardInterrupt(), 130, ""),
    (RuntimeError("boom"), 1, "RuntimeError: boom"),
])
def test_run_maps_what_main_raised_to_the_interpreter_s_exit_code_and_output(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: BaseException, code: int,
        printed: str) -> None:
    def main(argv: list[str] | None = None) -> int:
        raise raised

    def exit_(status: int) -> None:
        raise _Ended(status)

    monkeypatch.setattr(learner, "main", main)
    monkeypatch.setattr(learner.os, "_exit", exit_)
    with pytest.raises(_Ended) as ended:
        learner.run([])
    assert ended.value.args == (code,)
    assert printed in capsys.readouterr().err
