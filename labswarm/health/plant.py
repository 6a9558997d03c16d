"""A plant model of a session's queue and its workers, to test and tune controllers without a cluster.

The queue receives ``rate`` tasks/s; ``workers`` consumers each finish ``capacity`` tasks/s while tasks are
waiting. The controller sees the state ``lag`` seconds late (the RabbitMQ management API's statistics refresh
every ~5 s), and the consume rate averaged over a window, as a real monitor does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from labswarm.health.controllers.base import Controller, Observation


@dataclass
class QueuePlant:
    """A fluid queue with ``workers`` consumers of ``capacity`` tasks/s each.

    Attributes:
        capacity: tasks/s one worker finishes.
        workers: consumers now; change it to simulate workers leaving or joining.
        lag: seconds the observations are late.
        window: seconds the observed consume rate is averaged over.
        jitter: relative noise on each worker's speed (0.1 = ±10 %), from ``seed``.
    """

    capacity: float = 10.0
    workers: int = 2
    lag: float = 5.0
    window: float = 5.0
    jitter: float = 0.0
    seed: int = 0
    t: float = 0.0
    depth: float = 0.0
    consumed: float = 0.0
    published: float = 0.0
    _history: deque = field(default_factory=deque)
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._history.append((0.0, 0.0, 0.0, self.workers, 0.0))

    def step(self, rate: float, dt: float) -> None:
        """Advance ``dt`` seconds with publish rate ``rate`` (tasks/s)."""
        speed = self.workers * self.capacity * (1 + self.jitter * self._rng.uniform(-1, 1))
        arrived = rate * dt
        served = min(self.depth + arrived, max(0.0, speed) * dt)
        self.depth += arrived - served
        self.consumed += served
        self.published += arrived
        self.t += dt
        self._history.append((self.t, self.depth, self.consumed, self.workers, self.published))
        while self._history and self._history[0][0] < self.t - self.lag - self.window - 1.0:
            self._history.popleft()

    def _at(self, t: float) -> tuple[float, float, float, int, float]:
        best = self._history[0]
        for item in self._history:
            if item[0] > t:
                break
            best = item
        return best

    def observe(self, rate: float) -> Observation:
        """What a monitor reports now: the state ``lag`` seconds ago."""
        t0, depth, consumed, workers, published = self._at(self.t - self.lag)
        t1, _, consumed_before, _, published_before = self._at(self.t - self.lag - self.window)
        span = t0 - t1
        consume_rate = (consumed - consumed_before) / span if span > 0 else 0.0
        publish_rate = (published - published_before) / span if span > 0 else None
        return Observation(t=self.t, depth=depth, consume_rate=consume_rate, consumers=workers, rate=rate,
                           publish_rate=publish_rate)


def simulate(controller: Controller, plant: QueuePlant, seconds: float, *, rate: float, period: float = 1.0,
             dt: float = 0.05, events: dict[float, int] | None = None) -> dict[str, np.ndarray]:
    """Run ``controller`` on ``plant`` for ``seconds``, deciding every ``period`` seconds.

    Args:
        controller: the controller under test.
        plant: the queue model (mutated).
        seconds: simulated duration.
        rate: the initial publish rate, tasks/s.
        period: control period in seconds.
        dt: integration step in seconds.
        events: ``{time s: workers}``: change the number of workers at those times.

    Returns:
        Arrays sampled every ``period``: ``t``, ``depth`` (true), ``rate`` (publish), ``capacity`` (workers x
        capacity, the consume rate the queue allows).
    """
    events = dict(events or {})
    trace: dict[str, list[float]] = {"t": [], "depth": [], "rate": [], "capacity": []}
    next_decision = 0.0
    while plant.t < seconds:
        for when in [w for w in events if w <= plant.t]:
            plant.workers = events.pop(when)
        if plant.t >= next_decision:
            rate = controller.update(plant.observe(rate))
            next_decision += period
            trace["t"].append(plant.t)
            trace["depth"].append(plant.depth)
            trace["rate"].append(rate)
            trace["capacity"].append(plant.workers * plant.capacity)
        plant.step(rate, dt)
    return {k: np.asarray(v) for k, v in trace.items()}
