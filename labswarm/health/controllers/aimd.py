"""Additive increase, multiplicative decrease: TCP's congestion control applied to the publish rate."""

from __future__ import annotations

from pydantic import Field

from labswarm.health.controllers.base import Controller, ControllerConfig, Observation, register_controller


class AIMDConfig(ControllerConfig):
    """Steps of :class:`AIMDController`.

    Attributes:
        increase: tasks/s added per second while the queue is below target, as a share of the consume rate
            (at least ``min_rate``).
        decrease: while the queue is above target, the rate becomes this factor times the lower of the rate and
            the measured consume rate (once per ``cooldown``).
        cooldown: seconds between two decreases: the effect of one must be seen (stats lag) before the next.
    """

    increase: float = Field(0.05, gt=0)
    decrease: float = Field(0.8, gt=0, lt=1)
    cooldown: float = Field(5.0, ge=0)


@register_controller
class AIMDController(Controller):
    """Raise the rate linearly while the queue is short, cut it by a factor when it is long (Chiu & Jain, 1989,
    "Analysis of the increase and decrease algorithms for congestion avoidance"). Needs no model of the
    workers, converges to a fair share between sessions, and oscillates in a saw-tooth around the target."""

    name = "aimd"
    config_model = AIMDConfig
    config: AIMDConfig

    def __init__(self, config: AIMDConfig | None = None) -> None:
        super().__init__(config)
        self._last_decrease = float("-inf")

    def control(self, obs: Observation, target: float, error: float, dt: float) -> float:
        if error > 0:
            step = self.config.increase * max(obs.consume_rate, self.config.min_rate)
            return obs.rate + step * dt
        if error < 0 and obs.t - self._last_decrease >= self.config.cooldown:
            self._last_decrease = obs.t
            return min(obs.rate, obs.consume_rate) * self.config.decrease
        return obs.rate
