"""The launcher's side of the warm start (labswarm/deploy/warm.py) with a real warm process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labswarm.deploy import warm
from labswarm.deploy.warm import WarmStarter


def test_a_start_not_answered_in_time_kills_the_warm_process_so_no_late_answer_reaches_a_later_start(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(warm, "ANSWER_S", 0.01)  # the warm process is still importing torch: no answer yet
    starter = WarmStarter(dict(os.environ))
    try:
        request = {"spec": str(tmp_path / "spec.json"), "env": {}, "out": str(tmp_path / "out.log"),
                   "cwd": str(tmp_path), "cores": None, "join": [], "fallback": None}
        with pytest.raises(OSError, match="did not answer"):
            starter.start(request)
        starter._process.wait(30)
        assert not starter.alive()
        with pytest.raises(OSError, match="ended"):  # not the first request's late pid
            starter.start(request)
        assert not (tmp_path / "out.log").exists(), "the request not answered in time forked a learner"
    finally:
        starter.close()
