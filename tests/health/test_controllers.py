"""The control laws against a simulated queue and workers (labswarm.health.plant), with a 5-s stats lag."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from labswarm.errors import ConfigError
from labswarm.health.controllers import Observation, make_controller
from labswarm.health.plant import QueuePlant, simulate


def _window(trace: dict, start: float, end: float) -> dict:
    mask = (trace["t"] >= start) & (trace["t"] < end)
    return {k: v[mask] for k, v in trace.items()}


def test_pi_converges_from_a_flood_and_holds_the_band() -> None:
    plant = QueuePlant(capacity=10, workers=2, lag=5, jitter=0.1)
    trace = simulate(make_controller({"name": "pi"}), plant, 200, rate=500)
    late = _window(trace, 100, 200)
    target = 3.0 * 20  # target_seconds x consume rate
    assert np.all(np.abs(late["depth"] - target) < 0.5 * target), late["depth"]
    # after convergence the publish rate is within 15 % of the consume rate
    assert abs(np.mean(late["rate"]) - 20) < 0.15 * 20
    # no sustained oscillation: the rate's spread stays small
    assert np.std(late["rate"]) < 0.15 * 20


def test_pi_follows_worker_loss_and_gain() -> None:
    plant = QueuePlant(capacity=10, workers=2, lag=5)
    trace = simulate(make_controller({"name": "pi"}), plant, 420, rate=20, events={140: 1, 280: 4})
    one = _window(trace, 220, 280)
    four = _window(trace, 360, 420)
    assert abs(np.mean(one["rate"]) - 10) < 1.5
    assert abs(np.mean(four["rate"]) - 40) < 6
    assert np.all(four["depth"] < 3 * 120)


@pytest.mark.parametrize("name", ["pi", "aimd"])
def test_bounds_are_respected(name: str) -> None:
    controller = make_controller({"name": name, "min_rate": 2.0, "max_rate": 15.0})
    trace = simulate(controller, QueuePlant(capacity=10, workers=4, lag=2), 120, rate=5)
    assert trace["rate"].min() >= 2.0 and trace["rate"].max() <= 15.0
    assert trace["rate"].max() == pytest.approx(15.0)  # 40/s of workers: it rises to the cap


def test_aimd_keeps_the_queue_bounded_and_the_workers_busy() -> None:
    plant = QueuePlant(capacity=10, workers=2, lag=5)
    trace = simulate(make_controller({"name": "aimd"}), plant, 300, rate=20)
    late = _window(trace, 100, 300)
    assert late["depth"].max() < 400
    assert np.mean(late["rate"]) > 0.7 * 20


def test_deadband_leaves_the_rate_alone() -> None:
    controller = make_controller({"name": "aimd", "deadband": 0.2})
    obs = Observation(t=0.0, depth=33.0, consume_rate=10.0, consumers=2, rate=10.0)  # target 30: inside 20 %
    assert controller.update(obs) == 10.0
    assert controller.update(Observation(t=1.0, depth=33.0, consume_rate=10.0, consumers=2, rate=10.0)) == 10.0


def test_target_depth_floor() -> None:
    controller = make_controller({"name": "pi", "min_depth": 4})
    assert controller.target_depth(Observation(0, 0, 0.0, consumers=8, rate=1, prefetch=1)) == 16
    assert controller.target_depth(Observation(0, 0, 0.5, consumers=1, rate=1)) == 4
    assert controller.target_depth(Observation(0, 0, 50.0, consumers=1, rate=1)) == 150


def test_unknown_and_invalid_controllers() -> None:
    with pytest.raises(ConfigError, match="known: aimd, pi"):
        make_controller({"name": "pid"})
    with pytest.raises(ValidationError):
        make_controller({"name": "pi", "min_rate": 10, "max_rate": 1})


@pytest.mark.parametrize("name", ["pi", "aimd"])
def test_no_windup_against_a_publisher_ceiling_and_the_ceiling_is_probed(name: str) -> None:
    # workers could take 1,000 tasks/s but the publisher achieves 180/s (a ceiling the controller is not told),
    # until it is lifted at 60 s
    plant = QueuePlant(capacity=10, workers=100, lag=1.0, publish_ceiling=180.0, jitter=0.1)
    controller = make_controller({"name": name})
    trace = simulate(controller, plant, 200, rate=200, ceilings={60: 1500.0})
    capped = _window(trace, 25, 60)
    headroom = controller.config.headroom
    # the rate asked stays just above what the publisher achieves: no climb to max_rate (2,000)
    assert capped["rate"].max() <= (1 + headroom) * 180 * 1.05, capped["rate"]
    assert capped["rate"].min() >= 180 * 0.95, capped["rate"]
    # and it holds still: no saw-tooth
    assert capped["rate"].max() - capped["rate"].min() <= 0.1 * 180, capped["rate"]
    if name == "pi":  # the PI's probe finds the new ceiling (the workers') and the queue settles at its target
        late = _window(trace, 140, 200)
        assert abs(np.mean(late["rate"]) - 1000) < 0.15 * 1000
        assert late["depth"].max() < 2 * 3 * 1000


def test_first_decision_after_the_start_window_does_not_flood() -> None:
    # held by its start window, the session published 20/s while 200/s was in force: the workers keep up
    obs = Observation(t=0.0, depth=0.0, consume_rate=18.0, consumers=2, rate=200.0, publish_rate=20.0,
                      asked_rate=200.0, backlog=2000)
    rate = make_controller({"name": "pi"}).update(obs)
    assert 18.0 <= rate <= 1.25 * 20.0


def test_pi_slow_start_reaches_the_workers_quickly_without_flooding() -> None:
    # 2 workers of 100 tasks/s, a session started at 5 tasks/s (issue 27: first decisions of 3 and 14 tasks/s
    # where the workers did ~20; a trivial session's capacity is hundreds): at the probe's +20 %/s alone it took
    # 28 decisions to reach 90 % of the workers with the ledger's 0.5-s lag (37 at 1,000 tasks/s). With a 5-s-late
    # depth the slow start is off (it overshot to 3.8x the target, then cut the rate to the minimum): no worse.
    capacity, target = 200.0, 3.0 * 200.0
    for lag, steps in ((0.5, 12), (5.0, 40)):
        plant = QueuePlant(capacity=capacity / 2, workers=2, lag=lag, jitter=0.1)
        trace = simulate(make_controller({"name": "pi"}), plant, 120, rate=5)
        reached = int(np.argmax(trace["rate"] >= 0.9 * capacity))
        assert trace["rate"][reached] >= 0.9 * capacity and reached <= steps, (lag, reached, trace["rate"][:30])
        # no flood: the queue stays near its target (a lagged monitor overshoots more), and once fed the workers
        # are not starved by a rate cut to the minimum
        assert trace["depth"].max() < (1.5 if lag < 1 else 2.5) * target, (lag, trace["depth"].max())
        assert trace["rate"][reached:].min() > 0.4 * capacity, (lag, trace["rate"][reached:].min())
        late = _window(trace, 80, 120)
        assert abs(np.mean(late["rate"]) - capacity) < 0.1 * capacity
        assert np.all(np.abs(late["depth"] - target) < 0.5 * target), late["depth"]
