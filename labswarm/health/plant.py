"""A plant model of a session's queue and its workers, to test and tune controllers without a cluster.

The queue receives ``rate`` tasks/s; ``workers`` consumers each finish ``capacity`` tasks/s while tasks are
waiting. The controller sees the state ``lag`` seconds late (the RabbitMQ management API's statistics refresh
every ~5 s), and the consume rate averaged over a window, as a real monitor does. :class:`SharedPlant` models
several sessions' queues drained by one pool of workers that take from every non-empty queue in turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from labswarm.health.controllers.base import Controller, Observation
from labswarm.health.share import steer


@dataclass
class QueuePlant:
    """A fluid queue with ``workers`` consumers of ``capacity`` tasks/s each.

    Attributes:
        capacity: tasks/s one worker finishes.
        workers: consumers now; change it to simulate workers leaving or joining.
        lag: seconds the observations are late.
        window: seconds the observed consume rate is averaged over.
        jitter: relative noise on each worker's speed (0.1 = ±10 %), from ``seed``.
        publish_ceiling: the most the publisher achieves, tasks/s, whatever the rate asked (a slow broker or
            publisher); ``None``: it publishes at the rate asked.
    """

    capacity: float = 10.0
    workers: int = 2
    lag: float = 5.0
    window: float = 5.0
    jitter: float = 0.0
    seed: int = 0
    publish_ceiling: float | None = None
    t: float = 0.0
    depth: float = 0.0
    consumed: float = 0.0
    published: float = 0.0
    asked: float = 0.0
    _history: deque = field(default_factory=deque)
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._history.append((0.0, 0.0, 0.0, self.workers, 0.0, 0.0))

    def step(self, rate: float, dt: float) -> None:
        """Advance ``dt`` seconds with publish rate ``rate`` (tasks/s; at most ``publish_ceiling`` is achieved)."""
        speed = self.workers * self.capacity * (1 + self.jitter * self._rng.uniform(-1, 1))
        achieved = rate if self.publish_ceiling is None else min(rate, self.publish_ceiling)
        arrived = achieved * dt
        served = min(self.depth + arrived, max(0.0, speed) * dt)
        self.depth += arrived - served
        self.consumed += served
        self.published += arrived
        self.asked += rate * dt
        self.t += dt
        self._history.append((self.t, self.depth, self.consumed, self.workers, self.published, self.asked))
        while self._history and self._history[0][0] < self.t - self.lag - self.window - 1.0:
            self._history.popleft()

    def _at(self, t: float) -> tuple[float, float, float, int, float, float]:
        return _state_at(self._history, t)

    def observe(self, rate: float) -> Observation:
        """What a monitor reports now: the state ``lag`` seconds ago (the asked rate over the same window)."""
        t0, depth, consumed, workers, published, asked = self._at(self.t - self.lag)
        t1, _, consumed_before, _, published_before, asked_before = self._at(self.t - self.lag - self.window)
        span = t0 - t1
        consume_rate = (consumed - consumed_before) / span if span > 0 else 0.0
        publish_rate = (published - published_before) / span if span > 0 else None
        asked_rate = (asked - asked_before) / span if span > 0 else None
        return Observation(t=self.t, depth=depth, consume_rate=consume_rate, consumers=workers, rate=rate,
                           publish_rate=publish_rate, asked_rate=asked_rate, depth_age=self.lag)


def simulate(controller: Controller, plant: QueuePlant, seconds: float, *, rate: float, period: float = 1.0,
             dt: float = 0.05, events: dict[float, int] | None = None,
             ceilings: dict[float, float | None] | None = None) -> dict[str, np.ndarray]:
    """Run ``controller`` on ``plant`` for ``seconds``, deciding every ``period`` seconds.

    Args:
        controller: the controller under test.
        plant: the queue model (mutated).
        seconds: simulated duration.
        rate: the initial publish rate, tasks/s.
        period: control period in seconds.
        dt: integration step in seconds.
        events: ``{time s: workers}``: change the number of workers at those times.
        ceilings: ``{time s: tasks/s or None}``: change the plant's ``publish_ceiling`` at those times.

    Returns:
        Arrays sampled every ``period``: ``t``, ``depth`` (true), ``rate`` (publish), ``capacity`` (workers x
        capacity, the consume rate the queue allows).
    """
    events = dict(events or {})
    ceilings = dict(ceilings or {})
    trace: dict[str, list[float]] = {"t": [], "depth": [], "rate": [], "capacity": []}
    next_decision = 0.0
    while plant.t < seconds:
        for when in [w for w in events if w <= plant.t]:
            plant.workers = events.pop(when)
        for when in [w for w in ceilings if w <= plant.t]:
            plant.publish_ceiling = ceilings.pop(when)
        if plant.t >= next_decision:
            rate = controller.update(plant.observe(rate))
            next_decision += period
            trace["t"].append(plant.t)
            trace["depth"].append(plant.depth)
            trace["rate"].append(rate)
            trace["capacity"].append(plant.workers * plant.capacity)
        plant.step(rate, dt)
    return {k: np.asarray(v) for k, v in trace.items()}


def _state_at(history: Iterable[tuple], t: float) -> tuple:
    """The last recorded state ``(t, ...)`` at or before time ``t`` (the oldest one if all are later)."""
    best = None
    for item in history:
        if best is not None and item[0] > t:
            break
        best = item
    if best is None:
        raise ValueError("no state recorded")
    return best


def round_robin(available: np.ndarray, work: float) -> np.ndarray:
    """Split ``work`` messages of service equally among queues holding ``available`` messages each; a queue
    with less than its equal part leaves the rest to the others (a worker takes from its queues in turn).

    Returns:
        Messages served per queue, each at most its ``available``, summing to ``min(work, available.sum())``.
    """
    served = np.zeros_like(available, dtype=float)
    left = max(0.0, work)
    open_ = [i for i in range(len(available)) if available[i] > 0]
    while open_ and left > 1e-12:
        part = left / len(open_)
        short = [i for i in open_ if available[i] - served[i] <= part]
        if not short:
            for i in open_:
                served[i] += part
            break
        for i in short:
            left -= available[i] - served[i]
            served[i] = available[i]
            open_.remove(i)
    return served


@dataclass
class SharedPlant:
    """Several sessions' queues drained by one pool of ``workers`` consumers of ``capacity`` tasks/s each, every
    worker subscribed to every queue (RabbitMQ's round robin: each queue that holds messages gets an equal part
    of the workers, whatever the publish rates; :func:`round_robin`).

    Attributes:
        queues: number of sessions (queues).
        capacity: tasks/s one worker finishes.
        workers: consumers now; change it to simulate workers leaving or joining.
        lag: seconds the observations are late.
        window: seconds the observed consume rates are averaged over.
        jitter: relative noise on the workers' speed (0.1 = ±10 %), from ``seed``.
    """

    queues: int = 2
    capacity: float = 10.0
    workers: int = 2
    lag: float = 1.0
    window: float = 5.0
    jitter: float = 0.0
    seed: int = 0
    t: float = 0.0
    depth: np.ndarray = field(init=False)
    consumed: np.ndarray = field(init=False)
    published: np.ndarray = field(init=False)
    _history: deque = field(default_factory=deque)
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.depth = np.zeros(self.queues)
        self.consumed = np.zeros(self.queues)
        self.published = np.zeros(self.queues)
        self._record()

    def _record(self) -> None:
        self._history.append((self.t, self.depth.copy(), self.consumed.copy(), self.workers, self.published.copy()))
        while self._history and self._history[0][0] < self.t - self.lag - self.window - 1.0:
            self._history.popleft()

    def step(self, rates: np.ndarray, dt: float) -> None:
        """Advance ``dt`` seconds with the publish rates ``rates`` (tasks/s, one per queue)."""
        speed = self.workers * self.capacity * (1 + self.jitter * self._rng.uniform(-1, 1))
        arrived = np.asarray(rates, dtype=float) * dt
        served = round_robin(self.depth + arrived, max(0.0, speed) * dt)
        self.depth += arrived - served
        self.consumed += served
        self.published += arrived
        self.t += dt
        self._record()

    def _at(self, t: float) -> tuple:
        return _state_at(self._history, t)

    def observe(self, i: int, rate: float) -> Observation:
        """What a monitor reports now of queue ``i``: its state ``lag`` seconds ago."""
        t0, depth, consumed, workers, published = self._at(self.t - self.lag)
        t1, _, consumed_before, _, published_before = self._at(self.t - self.lag - self.window)
        span = t0 - t1
        consume_rate = (consumed[i] - consumed_before[i]) / span if span > 0 else 0.0
        publish_rate = (published[i] - published_before[i]) / span if span > 0 else None
        return Observation(t=self.t, depth=float(depth[i]), consume_rate=float(consume_rate), consumers=workers,
                           rate=rate, publish_rate=None if publish_rate is None else float(publish_rate),
                           depth_age=self.lag)


def simulate_shared(controllers: list[Controller], weights: list[float], plant: SharedPlant, seconds: float, *,
                    rates: list[float], max_total_waiting: float | None = None, period: float = 1.0,
                    dt: float = 0.05, events: dict[float, int] | None = None) -> dict[str, np.ndarray]:
    """Run one controller per queue of ``plant``, sharing the workers by ``weights`` (:func:`~labswarm.health.
    share.steer`, as the health loop does), for ``seconds``, deciding every ``period`` seconds.

    Args:
        controllers: one per queue.
        weights: one per queue, > 0.
        plant: the shared queues model (mutated).
        seconds: simulated duration.
        rates: the initial publish rates, tasks/s.
        max_total_waiting: the budget of waiting messages over all queues; ``None`` or 0: none.
        period: control period in seconds.
        dt: integration step in seconds.
        events: ``{time s: workers}``: change the number of workers at those times.

    Returns:
        Arrays sampled every ``period``: ``t`` (n,), and (n, queues) ``depth`` (true), ``rate`` (publish),
        ``consumed`` (cumulative tasks finished), ``cap`` (share cap, NaN when uncapped), ``target`` (depth).
    """
    events = dict(events or {})
    current = np.asarray(rates, dtype=float)
    trace: dict[str, list] = {"t": [], "depth": [], "rate": [], "consumed": [], "cap": [], "target": []}
    next_decision = 0.0
    while plant.t < seconds:
        for when in [w for w in events if w <= plant.t]:
            plant.workers = events.pop(when)
        if plant.t >= next_decision:
            decided = steer({i: (c, plant.observe(i, current[i]), w)
                             for i, (c, w) in enumerate(zip(controllers, weights, strict=True))}, max_total_waiting)
            current = np.array([decided[i][0] for i in range(plant.queues)])
            seen = [decided[i][1] for i in range(plant.queues)]
            next_decision += period
            trace["t"].append(plant.t)
            trace["depth"].append(plant.depth.copy())
            trace["rate"].append(current.copy())
            trace["consumed"].append(plant.consumed.copy())
            trace["cap"].append([np.nan if o.max_rate is None else o.max_rate for o in seen])
            trace["target"].append([c.target_depth(o) for c, o in zip(controllers, seen, strict=True)])
        plant.step(current, dt)
    return {k: np.asarray(v) for k, v in trace.items()}
