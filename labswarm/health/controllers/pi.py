"""The default controller: proportional-integral on the queue depth, with the consume rate as feed-forward."""

from __future__ import annotations

from pydantic import Field

from labswarm.health.controllers.base import Controller, ControllerConfig, Observation, register_controller


class PIConfig(ControllerConfig):
    """Gains of :class:`PIController`.

    Attributes:
        closing_seconds: the proportional term closes a depth error in about this many seconds
            (``kp = 1 / closing_seconds``, in 1/s). Keep it above the measurement lag (the management API's
            statistics are ~5 s late; the ledger's ~0.5 s).
        integral_seconds: integral time ``Ti`` in seconds (``ki = kp / Ti``): it removes a steady error the
            feed-forward leaves (a biased consume-rate estimate).
        integral_limit: anti-windup: the integral term is held within ``±integral_limit x`` the consume rate.
        probe: while the queue is empty and the workers finish what is published, the rate grows at least
            this much per second (relative; 0.2 = +20 %/s) from the rate in force, or from the measured
            publish rate when the publisher falls short of the rate asked (a session held by its start window
            until the first decision has a rate of 200 tasks/s in force that it never reached): an
            empty queue hides how fast the workers could go, since they consume only what is published (TCP's
            slow start, for the same reason).
    """

    closing_seconds: float = Field(6.0, gt=0)
    integral_seconds: float = Field(30.0, gt=0)
    integral_limit: float = Field(0.5, ge=0)
    probe: float = Field(0.2, ge=0)


@register_controller
class PIController(Controller):
    """``rate = consume_rate + kp * e + ki * ∫e dt``, with ``e = target_depth - depth``.

    The feed-forward term (the measured consume rate) does the bulk of the work: in steady state the publish
    rate equals the consume rate and the queue holds its target. The P term drains or fills the queue toward
    the target in ``closing_seconds``; the I term, clamped (anti-windup) and frozen while the output saturates
    at a bound, the publisher falls short of the rate asked (its ceiling, :meth:`Controller.publisher_limit`)
    or has nothing left to send, removes what bias remains. A classic PI with feed-forward (Åström & Murray,
    *Feedback Systems*, 2nd ed., §10.3 and §11.4 on windup).
    """

    name = "pi"
    config_model = PIConfig
    config: PIConfig

    def __init__(self, config: PIConfig | None = None) -> None:
        super().__init__(config)
        self.integral = 0.0

    def control(self, obs: Observation, target: float, error: float, dt: float) -> float:
        kp = 1.0 / self.config.closing_seconds
        ki = kp / self.config.integral_seconds
        unclamped = obs.consume_rate + kp * error + ki * self.integral
        saturated = self.clamp(unclamped, obs) != unclamped or unclamped > self.publisher_limit(obs)
        if dt > 0 and obs.backlog > 0 and not (saturated and error * unclamped > 0):
            self.integral += error * dt
            limit = self.config.integral_limit * max(obs.consume_rate, self.config.min_rate) / ki
            self.integral = max(-limit, min(limit, self.integral))
        out = obs.consume_rate + kp * error + ki * self.integral
        # the workers finish all that was published (same window, same lag): they may be starved
        keeping_up = obs.consume_rate >= 0.8 * obs.measured_publish_rate
        if obs.depth < 1.0 and keeping_up and obs.backlog > 0:
            short = obs.publisher_short(self.config.shortfall)
            achieved = min(obs.rate, obs.publish_rate) if short and obs.publish_rate is not None else obs.rate
            out = max(out, achieved * (1.0 + self.config.probe * dt))
        return out
