"""Sessions sharing one pool of workers by weight, against the shared-queues plant model (round robin across a
worker's queues), and the total budget of waiting messages."""

from __future__ import annotations

import numpy as np
import pytest

from labswarm.health.controllers import Observation, make_controller
from labswarm.health.plant import SharedPlant, round_robin, simulate_shared
from labswarm.health.share import Claim, fair_limits, steer, weighted_max_min


def _shares(trace: dict, start: float, end: float) -> tuple[np.ndarray, float]:
    """Each queue's part of the tasks consumed in ``[start, end)`` and the total consume rate (tasks/s)."""
    mask = (trace["t"] >= start) & (trace["t"] < end)
    t, consumed = trace["t"][mask], trace["consumed"][mask]
    done = consumed[-1] - consumed[0]
    return done / done.sum(), done.sum() / (t[-1] - t[0])


def test_weighted_max_min() -> None:
    inf = float("inf")
    assert weighted_max_min(40, {"a": 3, "b": 1}, {"a": inf, "b": inf}) == {"a": 30, "b": 10}
    # a session that cannot use its part leaves it to the others, by weight
    assert weighted_max_min(40, {"a": 1, "b": 1, "c": 2}, {"a": 4, "b": inf, "c": inf}) == {"a": 4, "b": 12, "c": 24}
    assert weighted_max_min(-5, {"a": 1}, {"a": inf}) == {"a": 0}
    with pytest.raises(ValueError, match="weights must be > 0"):
        weighted_max_min(10, {"a": 0}, {"a": inf})


def test_equal_weights_cap_nobody_and_the_lower_weight_is_capped_at_its_share() -> None:
    equal = fair_limits({"a": Claim(1, 20, 60), "b": Claim(1, 20, 60)})
    assert [lim.rate for lim in equal.values()] == [None, None]
    assert [lim.share for lim in equal.values()] == [20, 20]
    weighted = fair_limits({"a": Claim(3, 20, 60), "b": Claim(1, 20, 60)})
    assert weighted["a"].rate is None  # the highest weight keeps its queue and takes the rest
    assert weighted["b"].rate == pytest.approx(10)  # a quarter of the 40/s the workers finish
    # weights 2:1:1: both lower ones capped at a quarter; a session with nothing left to publish takes no part
    three = fair_limits({"a": Claim(2, 10, 30), "b": Claim(1, 10, 30), "c": Claim(1, 20, 30),
                         "done": Claim(5, 5, 15, publishing=False)})
    assert three["a"].rate is None and three["done"].rate is None and three["done"].share is None
    assert three["b"].rate == three["c"].rate == pytest.approx(10)


def test_budget_scales_the_targets_down_in_proportion() -> None:
    limits = fair_limits({"a": Claim(1, 30, 90), "b": Claim(1, 10, 30)}, max_total_waiting=60)
    assert limits["a"].target == pytest.approx(45) and limits["b"].target == pytest.approx(15)
    controller = make_controller({"name": "pi"})
    obs = Observation(t=0, depth=0, consume_rate=30, consumers=2, rate=30, max_target=limits["a"].target)
    assert controller.target_depth(obs) == pytest.approx(45)  # 3 s x 30/s = 90 without the budget


@pytest.mark.parametrize("unbounded", [None, 0])
def test_no_budget_leaves_each_session_its_own_target(unbounded: int | None) -> None:
    claims = {"a": Claim(1, 30, 90), "b": Claim(1, 10, 30)}
    assert [lim.target for lim in fair_limits(claims, max_total_waiting=unbounded).values()] == [None, None]
    sessions = {"a": (make_controller({"name": "pi"}), Observation(t=0, depth=0, consume_rate=30, consumers=2,
                                                                   rate=30), 1.0)}
    _, seen = steer(sessions, max_total_waiting=unbounded)["a"]
    assert seen.max_target is None


def test_a_zero_budget_is_the_setting_for_no_budget() -> None:
    from labswarm.settings import Settings

    assert Settings(max_total_waiting=0).max_total_waiting == 0  # 0: unbounded, as for max_queue_length


def test_the_cap_holds_the_rate_and_freezes_the_integral() -> None:
    controller = make_controller({"name": "pi"})
    for t in range(30):  # an empty queue for 30 s: the controller wants more, the share holds it
        rate = controller.update(Observation(t=t, depth=0, consume_rate=10, consumers=2, rate=10, max_rate=10))
        assert rate == pytest.approx(10)
    assert controller.integral == 0
    # min_rate wins over a smaller share: a session is never stopped
    assert controller.update(Observation(t=31, depth=0, consume_rate=1, consumers=2, rate=1, max_rate=0.1)) == 0.5


def test_round_robin_serves_non_empty_queues_alike_whatever_the_publish_rates() -> None:
    assert round_robin(np.array([100.0, 100.0]), 20).tolist() == [10, 10]
    assert round_robin(np.array([100.0, 4.0, 0.0]), 20).tolist() == [16, 4, 0]
    # the design trap: two queues held non-empty share the workers ~1:1, even published at 3:1
    plant = SharedPlant(queues=2, capacity=10, workers=2)
    for _ in range(1200):
        plant.step(np.array([30.0, 10.0]), 0.05)
    assert plant.consumed.tolist() == pytest.approx([600, 600])


@pytest.mark.parametrize("weights", [[1, 1], [3, 1], [1, 3], [2, 1, 1]])
@pytest.mark.parametrize("lag", [1.0, 5.0])
def test_sessions_share_the_workers_by_weight(weights: list[float], lag: float) -> None:
    n = len(weights)
    plant = SharedPlant(queues=n, capacity=10, workers=4, lag=lag, jitter=0.1)
    trace = simulate_shared([make_controller({"name": "pi"}) for _ in weights], weights, plant, 160, rates=[300] * n)
    expected = np.asarray(weights) / sum(weights)
    for start in (60, 100, 140):
        shares, rate = _shares(trace, start, start + 20)
        assert np.all(np.abs(shares - expected) <= 0.05 * expected), (start, shares)
        assert rate > 0.95 * 40  # the workers stay busy
    late = trace["rate"][trace["t"] >= 100]
    assert np.all(np.std(late, axis=0) < 0.1 * np.mean(late, axis=0))  # no sustained oscillation


def test_weighted_shares_follow_worker_loss_and_gain() -> None:
    plant = SharedPlant(queues=2, capacity=10, workers=4, lag=5.0, jitter=0.1)
    trace = simulate_shared([make_controller({"name": "pi"}) for _ in range(2)], [3, 1], plant, 420,
                            rates=[20, 20], events={140: 2, 280: 6})
    for (start, end), capacity in (((80, 140), 40), ((200, 280), 20), ((340, 420), 60)):
        shares, rate = _shares(trace, start, end)
        assert shares[0] == pytest.approx(0.75, abs=0.03), (start, shares)
        assert rate > 0.9 * capacity, (start, rate)
        mask = (trace["t"] >= start) & (trace["t"] < end)
        assert np.nanmean(trace["cap"][mask][:, 1]) == pytest.approx(capacity / 4, rel=0.1)
        assert np.all(np.isnan(trace["cap"][mask][:, 0]))


def test_the_total_waiting_stays_within_the_budget() -> None:
    budget = 60
    plant = SharedPlant(queues=3, capacity=10, workers=4, lag=1.0, jitter=0.1)
    trace = simulate_shared([make_controller({"name": "pi"}) for _ in range(3)], [1, 1, 1], plant, 160,
                            rates=[100] * 3, max_total_waiting=budget)
    late = trace["t"] >= 60
    assert np.all(trace["target"][late].sum(axis=1) <= budget + 1e-6)
    total = trace["depth"][late].sum(axis=1)
    assert total.mean() <= 1.2 * budget and total.max() <= 2.5 * budget
    unbudgeted = simulate_shared([make_controller({"name": "pi"}) for _ in range(3)], [1, 1, 1],
                                 SharedPlant(queues=3, capacity=10, workers=4, lag=1.0, jitter=0.1), 160,
                                 rates=[100] * 3)
    assert unbudgeted["depth"][late].sum(axis=1).mean() > 1.5 * budget  # 3 x 3 s of 13/s: the budget binds


def test_steer_passes_the_limits_to_each_controller() -> None:
    controllers = {k: make_controller({"name": "pi"}) for k in "ab"}
    observations = {k: Observation(t=0, depth=0, consume_rate=20, consumers=2, rate=20) for k in "ab"}
    decided = steer({k: (controllers[k], observations[k], w) for k, w in (("a", 3), ("b", 1))}, 100)
    assert decided["b"][1].max_rate == pytest.approx(10) and decided["b"][0] == pytest.approx(10)
    assert decided["a"][1].max_rate is None and decided["a"][0] > 20  # an empty queue: a fills it
    assert decided["a"][1].max_target == pytest.approx(50) == decided["b"][1].max_target
