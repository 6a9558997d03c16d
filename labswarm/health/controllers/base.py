"""Publish-rate controller base class and registry.

A controller sees an :class:`Observation` of one session's queue every control period and answers the next
publish rate. The base class owns the invariants every controller shares: the target queue depth, the rate
bounds, and the deadband; an implementation fills in :meth:`Controller.control`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, model_validator

from labswarm.plugin import PluginConfig
from labswarm.registry import CONTROLLERS


@dataclass(frozen=True, slots=True)
class Observation:
    """What a controller knows about one session at one instant.

    Attributes:
        t: time of the observation in seconds (monotonic).
        depth: messages waiting in the session's queue (ready, not yet delivered).
        consume_rate: samples/s the workers finish, smoothed (from the ledger or the broker's ack rate).
        consumers: worker processes consuming the queue.
        rate: the publish rate in force, tasks/s.
        publish_rate: the publish rate measured over the same window (and with the same lag) as
            ``consume_rate``; ``None`` when unknown (then ``rate`` stands for it).
        asked_rate: the mean publish rate in force over that same window, tasks/s: compared with
            ``publish_rate`` it tells a publisher that cannot go as fast as asked; ``None`` when unknown.
        prefetch: messages each consumer (worker process) holds: Celery's prefetch multiplier
            (:data:`labswarm.queue.app.PREFETCH_MULTIPLIER`).
        backlog: samples still to publish; 0 means the publisher has nothing left to send.
        max_rate: this session's share of the workers in samples/s when sessions share them
            (:mod:`labswarm.health.share`); the rate is held at or below it. ``None``: no share cap.
        max_target: this session's part of the total budget of waiting messages; the target depth is held at or
            below it. ``None``: no budget.
        depth_age: seconds ``depth`` is late (the ledger's ~0.5 s, a management API's up to ~5 s): the round
            trip of a rate change; the PI's slow start runs only on a fresh one (:mod:`labswarm.health.controllers.pi`).
    """

    t: float
    depth: float
    consume_rate: float
    consumers: int
    rate: float
    publish_rate: float | None = None
    asked_rate: float | None = None
    prefetch: int = 1
    backlog: int = 1
    max_rate: float | None = None
    max_target: float | None = None
    depth_age: float = 0.0

    @property
    def measured_publish_rate(self) -> float:
        """``publish_rate`` when measured, else ``rate``."""
        return self.rate if self.publish_rate is None else self.publish_rate

    def publisher_short(self, shortfall: float) -> bool:
        """The publisher achieved less than ``1 - shortfall`` of the rate asked (capped by the broker, the queue's
        bound, its start window or its own speed) while it still had samples to publish."""
        if self.publish_rate is None or self.asked_rate is None or self.backlog <= 0:
            return False
        return self.publish_rate < (1.0 - shortfall) * self.asked_rate


class ControllerConfig(PluginConfig):
    """Settings every controller shares.

    Attributes:
        target_seconds: target queue depth as seconds of the measured consume rate.
        min_depth: the target is never below this many messages, nor below twice the consumers' prefetch
            (so a worker always finds its next task waiting).
        min_rate: lowest publish rate in tasks/s (a session is never starved to zero: it could not restart).
        max_rate: highest publish rate in tasks/s.
        deadband: relative error band around the target in which the rate is left alone.
        shortfall: the publisher counts as capped when it achieves less than ``1 - shortfall`` of the rate asked
            (:meth:`Observation.publisher_short`).
        headroom: anti-windup on the publisher: while it is capped, the rate asked is held at most this much above
            what it achieves (relative; 0.25 = +25 %), so the controller probes the unknown ceiling instead of
            climbing against it (and falling back in a saw-tooth once the queue finally moves).
    """

    target_seconds: float = Field(3.0, gt=0)
    min_depth: float = Field(4.0, ge=1)
    min_rate: float = Field(0.5, gt=0)
    max_rate: float = Field(2000.0, gt=0)
    deadband: float = Field(0.15, ge=0, lt=1)
    shortfall: float = Field(0.15, gt=0, lt=1)
    headroom: float = Field(0.25, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> ControllerConfig:
        if self.min_rate > self.max_rate:
            raise ValueError(f"min_rate {self.min_rate} is above max_rate {self.max_rate}")
        return self


class Controller(ABC):
    """Base of publish-rate controllers.

    Args:
        config: the controller's settings (its subclass of :class:`ControllerConfig`).
    """

    name: ClassVar[str]
    config_model: ClassVar[type[ControllerConfig]] = ControllerConfig

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config if config is not None else self.config_model(name=self.name)
        self._last_t: float | None = None

    def target_depth(self, obs: Observation) -> float:
        """Target queue depth in messages: ``max(min_depth, 2 * prefetch * consumers, target_seconds * rate)``,
        then at most ``obs.max_target`` (the session's part of the total budget wins over the floors), and at
        least 1."""
        c = self.config
        target = max(c.min_depth, 2.0 * obs.prefetch * obs.consumers, c.target_seconds * obs.consume_rate)
        if obs.max_target is not None:
            target = max(1.0, min(target, obs.max_target))
        return target

    def clamp(self, rate: float, obs: Observation | None = None) -> float:
        """``rate`` within ``[min_rate, max_rate]``, and at most ``obs.max_rate`` (the session's share of the
        workers) when given; ``min_rate`` wins over a smaller share."""
        low, high = self.config.min_rate, self.config.max_rate
        if obs is not None and obs.max_rate is not None:
            high = max(low, min(high, obs.max_rate))
        return min(high, max(low, rate))

    def publisher_limit(self, obs: Observation) -> float:
        """The highest rate worth asking, tasks/s: ``(1 + headroom) x`` the measured publish rate while the
        publisher falls short of the rate asked, else infinite."""
        if obs.publisher_short(self.config.shortfall):
            return (1.0 + self.config.headroom) * max(obs.publish_rate or 0.0, self.config.min_rate)
        return float("inf")

    def update(self, obs: Observation) -> float:
        """The next publish rate in tasks/s, within the bounds and at most :meth:`publisher_limit`.

        The error is ``target - depth`` (positive: the queue is too short, publish faster), zeroed inside the
        deadband; ``dt`` is the time since the previous update (0 on the first).
        """
        dt = 0.0 if self._last_t is None else max(0.0, obs.t - self._last_t)
        self._last_t = obs.t
        target = self.target_depth(obs)
        error = target - obs.depth
        if abs(error) <= self.config.deadband * target:
            error = 0.0
        return self.clamp(min(self.control(obs, target, error, dt), self.publisher_limit(obs)), obs)

    @abstractmethod
    def control(self, obs: Observation, target: float, error: float, dt: float) -> float:
        """The control law: the next rate (before clamping) from the observation and the depth error."""


def register_controller(cls: type[Controller]) -> type[Controller]:
    """Class decorator: register a :class:`Controller` under its ``name``."""
    return CONTROLLERS.register(cls)


def make_controller(spec: dict | None = None) -> Controller:
    """Build a registered controller from ``{name: ..., **settings}`` (default: ``{name: pi}``).

    Raises:
        ConfigError: unknown name (the message lists the known ones).
        pydantic.ValidationError: invalid settings.
    """
    spec = dict(spec or {"name": "pi"})
    impl = CONTROLLERS.get(str(spec.get("name")))
    return impl(impl.config_model.model_validate(spec))
