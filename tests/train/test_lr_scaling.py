"""Learning-rate scaling with warm-up (issue 23 item 6; Goyal et al. 2017): the rate an optimizer step uses ramps
from the base rate to N × it over the warm-up, on top of the trainer's schedule, and the trainer's distributed mode
applies the framework's setting."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import require
from three_classes import write_learner_experiment

from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError
from labswarm.train import checkpoint
from labswarm.train.distributed import Framework, LearnerContext
from labswarm.train.distributed.lr_scaling import LrScaling, install, steps_per_pass

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)


def sgd_rates(scaling_spec: dict[str, Any], world_size: int, steps: int, steps_per_epoch: int,
              schedule: Any = None) -> tuple[list[float], list[float], LrScaling | None]:
    """Plain SGD (lr 0.1, no momentum) on ``loss = w.sum()`` (gradient 1): each step moves ``w`` by exactly the
    rate it used. A real framework (``model_averaging`` with one learner: its hook counts the steps, nothing to
    average) carries ``scaling_spec``; returns the rates used, the group's rate between steps, the scaling."""
    w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = torch.optim.SGD([w], lr=0.1)
    framework = Framework.from_spec({"name": "model_averaging", **scaling_spec})
    framework.attach(torch.nn.Linear(1, 1), optimizer, LearnerContext())
    scaling = install(framework, optimizer, world_size, steps_per_epoch)
    used, between = [], []
    for step in range(steps):
        before = float(w.detach())
        optimizer.zero_grad()
        w.sum().backward()
        optimizer.step()
        used.append(before - float(w.detach()))
        between.append(optimizer.param_groups[0]["lr"])
        if schedule is not None:
            schedule(step, optimizer)
    assert framework.steps == steps
    return used, between, scaling


def test_linear_rule_ramps_from_the_base_rate_to_twice_it_over_the_warmup_with_two_learners() -> None:
    used, between, scaling = sgd_rates({"lr_scaling": "linear"}, world_size=2, steps=7, steps_per_epoch=4)
    assert scaling is not None and (scaling.factor, scaling.warmup_steps) == (2.0, 4)  # 1 epoch of 4 steps
    assert used == pytest.approx([0.1, 0.125, 0.15, 0.175, 0.2, 0.2, 0.2], abs=1e-12)  # η + (2η - η) t / 4
    assert between == [0.1] * 7  # between steps the group holds the base rate: schedules see theirs
    assert scaling.last == 2.0


def test_the_scaling_applies_on_top_of_the_schedule_and_of_a_changed_rate() -> None:
    def halve_after_step_2(step: int, optimizer: Any) -> None:  # an epoch schedule or a live change of the rate
        if step == 1:
            for group in optimizer.param_groups:
                group["lr"] /= 2

    used, between, _ = sgd_rates({"lr_scaling": "linear", "lr_warmup_steps": 2}, world_size=4, steps=4,
                                 steps_per_epoch=100, schedule=halve_after_step_2)
    assert used == pytest.approx([0.1, 0.25, 0.05 * 4, 0.05 * 4], abs=1e-12)  # ×1, ×2.5, then ×4 of the halved
    assert between == pytest.approx([0.1, 0.1, 0.05, 0.05])  # read before the halving after the step


def test_which_settings_scale_and_by_how_much() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    per_learner = {"name": "allreduce", "batch": "per_learner"}  # each learner a whole batch: N times larger
    allreduce = install(Framework.from_spec(per_learner), optimizer, 2, steps_per_epoch=9)
    assert allreduce is not None and (allreduce.factor, allreduce.warmup_steps) == (2.0, 9)  # linear, the default
    allreduce.remove()
    # batch: global (the default): the learners split the experiment's batch, the global batch is unchanged: k = 1
    assert install(Framework.from_spec({"name": "allreduce"}), optimizer, 2, steps_per_epoch=9) is None
    sqrt = install(Framework.from_spec({**per_learner, "lr_scaling": "sqrt", "lr_warmup_epochs": 0.5}),
                   optimizer, 4, steps_per_epoch=9)
    assert sqrt is not None and (sqrt.factor, sqrt.warmup_steps) == (2.0, 4)  # √4; half of 9 steps, rounded
    sqrt.remove()
    assert install(Framework.from_spec({"name": "allreduce", "lr_scaling": "none"}), optimizer, 2, 9) is None
    assert install(Framework.from_spec({"name": "allreduce"}), optimizer, 1, 9) is None  # one learner
    assert install(Framework.from_spec({"name": "model_averaging"}), optimizer, 2, 9) is None  # its default
    assert install(Framework.from_spec({"name": "downpour"}), optimizer, 2, 9) is None  # the shards update
    assert steps_per_pass(36, 4, 2) == 5 and steps_per_pass(37, 4, 2) == 5 and steps_per_pass(41, 4, 2) == 6


@pytest.mark.parametrize(("framework", "path"), [
    ({"name": "allreduce", "lr_scaling": "cubic"}, "framework.lr_scaling"),
    ({"name": "allreduce", "lr_warmup_epochs": -1}, "framework.lr_warmup_epochs"),
    ({"name": "model_averaging", "lr_warmup_steps": 1.5}, "framework.lr_warmup_steps"),
    ({"name": "downpour", "lr_scaling": "linear"}, "framework.lr_scaling"),  # not a setting of its own
])
def test_bad_scaling_settings_name_the_field(framework: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_manifest({"name": "job", "experiment": "music_speech_noise", "learners": 2, "framework": framework,
                        "results_store": {"name": "local", "path": "/tmp/results"}})
    assert [p for p, _ in caught.value.errors] == [path], caught.value


@pytest.mark.slow
def test_two_allreduce_learners_of_the_trainer_ramp_over_the_first_epoch(three_classes: Path,
                                                                          tmp_path: Path) -> None:
    from distributed_run import logs, run_attempt

    _data, experiment, home = write_learner_experiment(three_classes, tmp_path, epochs=2)
    codes = run_attempt(1, lambda _rank: [sys.executable, "-m", "labswarm.train.distributed.learner", str(experiment),
                                          "--home", str(home), "--framework",
                                          '{"name": "allreduce", "batch": "per_learner"}'],  # the scaled case
                        tmp_path, framework={"name": "allreduce", "batch": "per_learner"})
    assert codes == {0: 0, 1: 0}, logs(tmp_path)
    run = next((home / "train").iterdir())
    for rank in range(2):
        records = checkpoint.read_metrics(run / f"rank-{rank}" / "metrics.jsonl")
        # per_learner: 36 samples in chunks of 4 (the experiment's batch, each learner's): 9 chunks, 5 lockstep
        # steps a pass, a global batch of 8 and a rate ramped to 2x; warm-up 1 epoch = 5 steps
        assert [r["steps"] for r in records] == [5, 5]
        assert [r["lr_scale"] for r in records] == pytest.approx([1.8, 2.0])  # step 4: 1 + 4/5; then 2
        assert records[0]["lr"] == pytest.approx(0.01)  # the schedule's base rate is recorded, not the scaled one
