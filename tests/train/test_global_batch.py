"""The synchronous frameworks' ``batch: global | per_learner`` setting (issue 23 item 6): under ``global`` (the
default of ``allreduce`` and ``sandblaster``) the learners split the experiment's batch; a size that does not divide
is refused naming ``framework.batch``, in a manifest, in the budget search's candidates (which fall back to
``per_learner``) and in a resume from a checkpoint of another chunk size. The trainer-level runs (2 learners'
chunks half the experiment's batch, every sample once per pass, the single trainer's step count) are in
``test_distributed.py``; the 422 through the manager in ``tests/jobs/test_distributed_jobs.py``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import require

from labswarm.compare.budget import candidates, fit_batch
from labswarm.config.experiment import load_experiment
from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError
from labswarm.train.distributed import Framework, LearnerContext

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "music_speech_noise.yml"  # batch size 32


@pytest.mark.parametrize(("spec", "learners", "batch", "factor"), [
    ({"name": "allreduce"}, 2, 16, 1),  # the default: global
    ({"name": "allreduce"}, 4, 8, 1),
    ({"name": "allreduce"}, 1, 32, 1),  # one learner: the whole batch
    ({"name": "allreduce", "batch": "per_learner"}, 2, 32, 2),  # the behaviour before the setting
    ({"name": "allreduce", "batch": "per_learner"}, 3, 32, 3),
    ({"name": "sandblaster"}, 2, 16, 1),
    ({"name": "model_averaging"}, 2, 32, 2),  # local SGD: each learner's steps are its own, no setting
    ({"name": "downpour"}, 3, 32, 3),  # asynchronous: no setting
])
def test_a_learners_batch_and_the_rate_scalings_k(spec: dict[str, Any], learners: int, batch: int,
                                                  factor: int) -> None:
    framework = Framework.from_spec(spec)
    assert framework.learner_batch(32, learners) == batch
    assert framework.batch_factor(learners) == factor


def test_a_global_batch_that_does_not_divide_is_refused_naming_the_field() -> None:
    for name in ("allreduce", "sandblaster"):
        with pytest.raises(ConfigError) as caught:
            Framework.from_spec({"name": name}).learner_batch(32, 3)
        [(path, reason)] = caught.value.errors
        assert path == "framework.batch" and "32" in reason and "3 learners" in reason and "per_learner" in reason
    with pytest.raises(ConfigError) as caught:  # not a setting of an asynchronous framework
        parse_manifest({"name": "job", "experiment": "music_speech_noise", "learners": 2,
                        "framework": {"name": "downpour", "batch": "global"},
                        "results_store": {"name": "local", "path": "/tmp/results"}})
    assert [p for p, _ in caught.value.errors] == ["framework.batch"]


def test_a_manifest_checks_the_split_against_its_experiment() -> None:
    experiment = load_experiment(EXAMPLE)

    def job(learners: int, **framework: Any) -> Any:
        return parse_manifest({"name": "job", "experiment": "music_speech_noise", "learners": learners,
                               "framework": {"name": "allreduce", **framework},
                               "results_store": {"name": "local", "path": "/tmp/results"}})

    assert job(2).framework.model_dump()["batch"] == "global"  # the default, shown in the resolved manifest
    job(2).training_config(experiment)  # 32 / 2
    job(3, batch="per_learner").training_config(experiment)
    with pytest.raises(ConfigError) as caught:
        job(3).training_config(experiment)
    assert [p for p, _ in caught.value.errors] == ["framework.batch"]


def test_the_budget_search_runs_a_candidate_that_cannot_split_the_batch_per_learner() -> None:
    runs = fit_batch(candidates(3), load_experiment(EXAMPLE))
    specs = {(n, spec["name"]): spec for n, spec in runs if spec is not None}
    assert specs[(3, "allreduce")]["batch"] == "per_learner"  # 32 does not divide by 3
    assert "batch" not in specs[(2, "allreduce")] and "batch" not in specs[(2, "sandblaster")]  # global
    assert "batch" not in specs[(3, "distributed_hogwild")]


def test_a_resume_from_a_cursor_of_another_chunk_size_is_refused() -> None:
    from torch.distributed import TCPStore

    from labswarm.train.distributed.cursor import GlobalCursor
    from labswarm.train.distributed.training import DistributedTraining

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=2))
    learner.cursor = GlobalCursor(store, 36, 2, owner="0:1:1")  # global: the experiment's 4 split in 2
    old = GlobalCursor(store, 36, 4, owner="0:0:1").state_dict()  # a checkpoint of per_learner chunks
    state = {"rank": 0, "framework": {"name": "allreduce", "steps": 3}, "cursor": old}
    with pytest.raises(ConfigError) as caught:
        learner.load_state_dict(state)
    assert [p for p, _ in caught.value.errors] == ["framework.batch"]
    learner.load_state_dict({**state, "cursor": learner.cursor.state_dict()})  # the same chunks: resumed
    assert learner.framework.steps == 3
