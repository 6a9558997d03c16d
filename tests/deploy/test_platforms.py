"""The one registry of launchers (labswarm.registry.LAUNCHERS): each platform gives a session's workers and a job's
learners, under the name a session's ``launcher`` and ``LABSWARM_JOB_LAUNCHER`` give."""

from __future__ import annotations

from pathlib import Path

import pytest

from labswarm.deploy.base import Platform
from labswarm.deploy.learners import learner_launcher
from labswarm.deploy.local import LocalLauncher
from labswarm.deploy.local_learners import LocalLearners
from labswarm.deploy.sessions import session_launcher
from labswarm.deploy.swarm import SwarmLauncher
from labswarm.deploy.swarm_learners import SwarmLearners
from labswarm.errors import ConfigError
from labswarm.registry import LAUNCHERS
from labswarm.settings import Settings


def test_the_built_in_platforms_are_registered_by_name() -> None:
    assert LAUNCHERS.names() == ["local", "swarm"]
    for name in LAUNCHERS:
        platform = LAUNCHERS.get(name)
        assert issubclass(platform, Platform) and platform.name == name


@pytest.mark.parametrize(("name", "workers", "learners"), [("local", LocalLauncher, LocalLearners),
                                                          ("swarm", SwarmLauncher, SwarmLearners)])
def test_one_name_gives_both_kinds_of_launcher(name: str, workers: type, learners: type, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, job_launcher=name)
    assert isinstance(session_launcher(name, "tones", "s1", settings), workers)
    assert isinstance(learner_launcher(settings), learners)


def test_an_unknown_learner_launcher_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown launcher 'kubernetes'; known: local, swarm") as caught:
        learner_launcher(Settings(home=tmp_path).model_copy(update={"job_launcher": "kubernetes"}))
    assert caught.value.errors[0][0] == "job_launcher"
