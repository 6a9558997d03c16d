"""The default controller: proportional-integral on the queue depth, with the consume rate as feed-forward."""

from __future__ import annotations

from pydantic import Field

from labswarm.health.controllers.base import Controller, ControllerConfig, Observation, register_controller

#: The slow start needs the queue seen within this many seconds (the ledger's depth, ~0.5 s late): while the
#: depth is late the rate grows on unseen, and with a 5-s-late depth (a management API's) the ramp overshot by
#: its growth over the lag (simulated, :mod:`labswarm.health.plant`, 2 workers of 100/s: the queue at 3.8x its
#: target, then the rate cut to the minimum while the late depth drained). Later than this, the probe alone.
SLOW_START_MAX_AGE_S = 1.0


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
            slow start, for the same reason). Past the slow start (below) it is the only growth.
        slow_start: until the first sign of a queue, the rate asked grows by this factor per second (one
            doubling per decision, as TCP's slow start doubles per round trip, RFC 5681 §3.1), and the first
            decision asks this factor times what the workers handled in the start window (their consume rate, or
            the publish rate they kept up with). A session starts far below its workers (first decisions of 3 and
            14 tasks/s where 2 workers did ~20 in issue 27's runs), and at the probe's +20 %/s a 2,000-sample
            session ended before its workers were ever fed. Held at a decision where the workers finish less
            than 80 % of what was published; left for good once the queue holds ``slow_start_exit`` of its
            target, or if the depth is later than :data:`SLOW_START_MAX_AGE_S`. 1 turns it off.
        slow_start_ceiling: in slow start the rate asked is at most this factor times the consume rate measured
            (at least ``min_rate``): what the workers were seen to do bounds the ramp's overshoot.
        slow_start_exit: the slow start ends when the queue holds this share of its target depth: a few messages
            are no sign (a packed message counts its samples), and the first decision's queue is the start
            window's, not the workers' limit.
    """

    closing_seconds: float = Field(6.0, gt=0)
    integral_seconds: float = Field(30.0, gt=0)
    integral_limit: float = Field(0.5, ge=0)
    probe: float = Field(0.2, ge=0)
    slow_start: float = Field(2.0, ge=1)
    slow_start_ceiling: float = Field(4.0, ge=1)
    slow_start_exit: float = Field(0.5, gt=0)


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
        #: in slow start: no sign of a queue seen yet (left for good at the first, as TCP's ssthresh is set)
        self.starting = self.config.slow_start > 1.0

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
        short = obs.publisher_short(self.config.shortfall)
        # the rate the publisher achieved: less than the rate in force while it falls short of it
        achieved = min(obs.rate, obs.publish_rate) if short and obs.publish_rate is not None else obs.rate
        if obs.depth < 1.0 and keeping_up and obs.backlog > 0:
            out = max(out, achieved * (1.0 + self.config.probe * dt))
        if obs.depth < 1.0 and obs.backlog > 0:  # never below what the workers demonstrably consumed
            out = max(out, obs.consume_rate)
        return self._slow_start(obs, target, out, achieved, dt, keeping_up)

    def _slow_start(self, obs: Observation, target: float, out: float, achieved: float, dt: float,
                    keeping_up: bool) -> float:
        """``out`` raised to ``slow_start ** dt x`` the rate achieved (``slow_start x`` the consume rate, or the
        publish rate the workers kept up with, at a first decision), at most ``slow_start_ceiling x`` the consume
        rate, until the queue is seen half its ``target`` depth (then ``out`` for good: the workers are fed; a few
        messages are no sign, the start window leaves some and a packed message counts its samples); held (``out``)
        at a decision where the workers finish less than 80 % of what was published (in flight, or a queue)."""
        if dt > 0 and obs.depth >= self.config.slow_start_exit * target:  # the first: the start window's queue
            self.starting = False
        if obs.depth_age > SLOW_START_MAX_AGE_S:  # a late depth: the probe alone (see the module's constant)
            self.starting = False
        if not self.starting or obs.backlog <= 0 or not keeping_up or obs.consume_rate <= 0:
            return out
        if dt <= 0:  # the first decision: from what the workers handled in the start window
            grown = self.config.slow_start * max(obs.consume_rate, min(achieved, obs.measured_publish_rate))
        else:  # one doubling per round trip: here a decision, the depth being fresh
            grown = achieved * self.config.slow_start ** dt
        ceiling = self.config.slow_start_ceiling * max(obs.consume_rate, self.config.min_rate)
        return max(out, min(grown, ceiling))
