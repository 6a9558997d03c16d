"""The control loop: every period, observe each running session, ask its controller, set its publish rate.

Depth comes from the session ledger (samples published without an outcome, less the ones the workers hold):
~0.5 s old, where the RabbitMQ management API's statistics are up to ~5 s old and move in steps. The management
API, when given, tells the consumers per queue (and its own depth is logged beside, for comparison). The
consume and publish rates come from the manager's counters too.
Every running session is taken to share one pool of workers: their rates are decided together, each session
capped at its share of the workers by weight and its target depth scaled into the total budget of waiting
messages (:mod:`labswarm.health.share`).
Each decision is appended to ``<log_dir>/health-<session>.jsonl`` (for ``labswarm health plot``).

A session is watched from the first tick that sees it running and steered from the first tick after its first
outcomes that sees more (the first with a consume rate to measure: for the next ``window`` seconds its rates are
measured from the tick that saw those first outcomes, not over idle seconds of workers still starting; if none
more come within ``window`` seconds, from the last idle tick); its first decision is always sent,
since the first rate set lifts the publisher's start window (:mod:`labswarm.sessions.window`), which held it until
then, self-clocked by the outcomes.
One failing poll or one session's bad data never stops the loop: the error is logged with the session and the
reason, and the next tick runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labswarm import strictjson
from labswarm.errors import ManagerError
from labswarm.health.controllers import Controller, Observation, make_controller
from labswarm.health.monitors import ManagerMonitor, QueueStats, RabbitMQMonitor
from labswarm.health.share import steer
from labswarm.health.users import session_weights
from labswarm.queue.app import PREFETCH_MULTIPLIER
from labswarm.timeseries import TimeSeries

log = logging.getLogger(__name__)

#: Seconds between two readings of the users' weights from the manager (``weights_from_manager``): an admin's
#: change of a weight (``PUT /v1/quotas/{user}``) reaches the shares within this.
WEIGHTS_EVERY_S = 10.0
#: Seconds the ledger's depth is late (outcomes reach the manager in ~0.5 s): the controllers' ``depth_age``.
LEDGER_AGE_S = 0.5


#: Samples the rates asked must have made due since the first decision before the publish rate is compared with
#: them (the anti-windup): two messages of the publisher's largest packing in a short run's first seconds (~8 real
#: samples a message at quiet task times, labswarm.sessions.packing), so a message not yet sent is not a shortfall.
MIN_SAMPLES_DUE = 16.0


@dataclass
class SessionTrack:
    """The time series and the controller of one session."""

    controller: Controller
    published: TimeSeries = field(default_factory=TimeSeries)
    finished: TimeSeries = field(default_factory=TimeSeries)
    depth: TimeSeries = field(default_factory=TimeSeries)
    rate: TimeSeries = field(default_factory=TimeSeries)
    asked: TimeSeries = field(default_factory=TimeSeries)  # the rate in force at each tick
    decided: bool = False  # a first decision was sent
    #: When the first decision was sent: the publish rate is measured from then on for a window (see observe)
    decided_at: float | None = None
    #: The last tick before the first outcome (time, finished).
    idle: tuple[float, float] | None = None
    #: The tick that saw the first outcomes (the one before it if that one saw some already: a session met running):
    #: until ``window`` s after it the rates are measured from there, not over the whole window, whose start has
    #: the workers still starting (no outcome), and the session is steered only once a later tick saw more.
    moving_since: float | None = None
    #: The samples finished at ``moving_since`` while the first decision waits for a tick that sees more (None:
    #: not waiting): a tick with none more read a consume rate of 0 and the first decision set the floor rate.
    first_finished: float | None = None


class HealthLoop:
    """Steers the publish rate of every running session (from its first outcome on: before, there is no
    consume rate to measure, and the publisher's start window holds the queue short).

    Args:
        manager: the manager monitor (reads sessions, sets rates).
        rabbitmq: the broker monitor, or ``None`` to estimate depth from the ledger.
        controller: spec of the controller each session gets (``{name: pi}`` by default).
        period: seconds between decisions.
        window: seconds the publish and consume rates are measured over.
        consumers: worker processes assumed per session when the broker cannot say (ledger mode).
        max_total_waiting: budget of messages waiting in all the sessions' queues together: their target
            depths are scaled down to sum to at most this. ``None`` or 0: no budget, each session's own target.
        log_dir: where each session's decisions are written as JSON lines; ``None`` writes none.
        clock: monotonic clock in seconds (tests).
        user_weight: a user's fair-share weight (:meth:`labswarm.auth.quotas.Policies.weight`): each user's
            running sessions share it by their own weights (:mod:`labswarm.health.users`); default 1 for everyone.
        weights_from_manager: read the users' weights from the manager instead (``GET /v1/quotas``, an admin's
            token: with the overrides an admin set there), every :data:`WEIGHTS_EVERY_S` seconds; ``user_weight``
            while the manager does not tell them (a user's token, an older manager, an error: logged).
    """

    def __init__(self, manager: ManagerMonitor, rabbitmq: RabbitMQMonitor | None = None, *,
                 controller: dict[str, Any] | None = None, period: float = 1.0, window: float = 5.0,
                 consumers: int = 1, max_total_waiting: float | None = None, log_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 user_weight: Callable[[str], float] | None = None, weights_from_manager: bool = False) -> None:
        self.manager = manager
        #: a user's fair-share weight: their sessions share it (labswarm.health.users); 1 each by default
        self.user_weight = user_weight or (lambda _user: 1.0)
        self.weights_from_manager = weights_from_manager
        self._manager_weights: tuple[dict[str, float], float] | None = None  # the manager's, when it told them
        self._weights_at: float | None = None  # when they were last asked (the loop's clock)
        self.rabbitmq = rabbitmq
        self.controller_spec = controller or {"name": "pi"}
        make_controller(self.controller_spec)  # fail now on a bad spec
        self.period = period
        self.window = window
        self.consumers = consumers
        self.max_total_waiting = max_total_waiting
        self.log_dir = log_dir
        self.clock = clock
        self.tracks: dict[str, SessionTrack] = {}
        self._t0 = clock()
        self.registry, self._gauges = _decision_metrics()
        self.broker_depth: dict[str, float | None] = {}

    def observe(self, session: dict[str, Any], queue: QueueStats | None, track: SessionTrack, t: float) -> Observation:
        """Build the controller's observation of one session from the manager's progress and the broker's stats."""
        track.published.append(t, session["published"])
        finished = session["finished"]
        if track.moving_since is None:
            if track.idle is not None and finished > track.idle[1]:
                # measured from the last idle tick, the first outcomes read low by how long before this tick they
                # came: outcomes are reported every 0.25 s, and a tick that saw 1 sample of a 4-sample message read
                # 1/s against workers doing 10-15/s (a 270-sample run, LOADED): a first decision of 1.9/s, the queue
                # at 0-2 samples for 4 of the next 9 s. From this tick, the next one reads a whole tick's rate.
                if track.idle[1] > 0:
                    track.moving_since = track.idle[0]
                else:
                    track.moving_since, track.first_finished = t, finished
            else:
                track.idle = (t, finished)
        fall_back = False
        if track.first_finished is not None and track.moving_since is not None and track.idle is not None:
            if finished > track.first_finished:
                track.first_finished = None  # steered from this tick, measured from the first outcomes' tick
            elif t - track.moving_since >= self.window:
                # messages of a second or more (2 workers, 4-sample messages of 1.5 s) leave ticks with no new
                # outcome: read from the first outcomes' tick, consume was 0 and the first decision the floor rate.
                # The start window feeds the workers while the loop waits for more; none for a whole window (the
                # workers stopped, or messages longer than it): measured from the last idle tick, the first outcomes
                track.moving_since, track.first_finished, fall_back = track.idle[0], None, True
        track.finished.append(t, finished)
        if track.decided:  # the rates asked by this loop: before its first decision the start window held the
            # publisher, whatever rate was in force (the default, thousands/s), and a mean over those made the
            # publisher look short, so the anti-windup capped the next rates at 1.5x a publish rate the window
            # had held down (270 real samples: ~12 s to climb from 3 to 20 samples/s, the workers starved)
            track.asked.append(t, float(session["rate"]))
        window = self.window
        if track.moving_since is not None and (t - track.moving_since < window or fall_back):
            # the session's first outcomes: a rate over the whole window counts the workers' start-up as idle
            # time (a 5-s window with the first outcome 1 s ago read a fifth of the real rate: the first decision
            # then cut the rate below it and starved the workers for ~10 s of a 270-sample run)
            # the publish rate too: before, the start window held the publisher (not its ceiling)
            window = t - track.moving_since + 1e-6
        consume = track.finished.rate(window)
        # the publish rate against the rates asked: over the same time, from the first decision on (before it the
        # start window held the publisher, self-clocked by the outcomes: counted in, the publisher looked short
        # of the first rate asked, so the anti-windup capped the next ones at 1.25x that mean, and a 270-sample
        # run's first rates went 5.9, 5.0, 4.6/s against workers consuming 10-11/s, queue empty, for 3-4 s)
        since = window if track.decided_at is None else min(window, t - track.decided_at + 1e-6)
        publish = track.published.rate(since)
        asked = track.asked.mean(since)
        if since * asked < MIN_SAMPLES_DUE:
            # too short a span to judge the publisher: it sends whole messages of several samples (~0.25 s of work
            # each), and one second after a first decision of a few samples/s none may have been due yet; judged
            # on it, it looked short (0 published) and the anti-windup cut the rate to the floor while the workers
            # starved (a quiet 270-sample run stalled 5 s at 0.6/s): no reading, no anti-windup, until enough were due
            publish = math.nan
        # Depth from the ledger (published, no outcome yet, less what the consumers hold) is ~0.5 s old; the
        # management API's is up to ~5 s old and moves in steps, which makes any controller overshoot. The
        # broker gives the consumers (and its own depth, logged beside for comparison).
        consumers = max(queue.consumers, 1) if queue is not None else self.consumers
        # each consumer holds up to PREFETCH_MULTIPLIER messages (late acks): those are not waiting in the queue
        depth = float(max(0, session["pending"] - consumers * PREFETCH_MULTIPLIER))
        self.broker_depth[session["id"]] = float(queue.ready) if queue is not None else None
        track.depth.append(t, depth)
        unpublished = session["total"] - (session["published"] - session.get("republished", 0)) - session["cached"]
        return Observation(
            t=t, depth=depth, consume_rate=0.0 if math.isnan(consume) else consume, consumers=consumers,
            prefetch=PREFETCH_MULTIPLIER,
            rate=float(session["rate"]), publish_rate=None if math.isnan(publish) else publish,
            asked_rate=None if math.isnan(publish) else asked, backlog=max(0, unpublished) + session["pending"],
            depth_age=LEDGER_AGE_S,
        )

    def weight_of(self, user: str) -> float:
        """``user``'s fair-share weight now: the manager's (``weights_from_manager``, when it told them), else
        ``user_weight``'s."""
        if self._manager_weights is None:
            return self.user_weight(user)
        users, default = self._manager_weights
        return users.get(user, default)

    async def refresh_weights(self, now: float) -> None:
        """With ``weights_from_manager``, ask the manager for the users' weights if the last answer is
        :data:`WEIGHTS_EVERY_S` old (``now``: the loop's clock); an error keeps the last ones (logged)."""
        if not self.weights_from_manager or (self._weights_at is not None and now - self._weights_at < WEIGHTS_EVERY_S):
            return
        self._weights_at = now
        try:
            self._manager_weights = await self.manager.user_weights()
        except ManagerError as exc:
            log.warning("the users' weights not refreshed: %s", exc)

    async def tick(self) -> dict[str, float]:
        """One control period: returns the new rate of each steered session.

        Raises:
            Exception: reading the sessions failed (:meth:`run` logs it and goes on); an error of one session
                (its data, its decision, setting its rate, its log) is logged and skips that session only.
        """
        sessions = [s for s in await self.manager.sessions() if s["status"] == "running"]
        queues: dict[str, QueueStats] | None = None
        if self.rabbitmq is not None and sessions:
            try:
                queues = await self.rabbitmq.poll({s["queue"] for s in sessions if isinstance(s.get("queue"), str)})
            except Exception as exc:
                log.warning("broker statistics unavailable, estimating depth from the ledger: %s: %s",
                            type(exc).__name__, exc)
        t = self.clock()
        steered = {}
        for session in sessions:
            sid = session.get("id")
            if not isinstance(sid, str):  # the manager names every session: a malformed answer
                log.warning("a session without an id (keys %s) skipped this tick", sorted(session))
                continue
            try:
                track = self.tracks.get(sid)
                if track is None:
                    track = self.tracks[sid] = SessionTrack(make_controller(self.controller_spec))
                queue = queues.get(session["queue"]) if queues is not None else None
                obs = self.observe(session, queue, track, t)
            except Exception as exc:
                log.warning("session %s: cannot observe it this tick: %s: %s", sid, type(exc).__name__, exc)
                continue
            # a consume rate measured: steer it, from the first tick after the one that saw the first outcomes
            # with more outcomes (or a window later, see observe); a session met with outcomes already from its
            # second tick
            if session["finished"] > 0 and len(track.finished) >= 2 and track.first_finished is None:
                steered[sid] = (session, track, obs)
        # one decision for all: the sessions share the workers by weight and one budget of waiting messages
        await self.refresh_weights(t)
        try:
            weights = session_weights({sid: (session.get("owner"), float(session.get("weight") or 1.0))
                                       for sid, (session, _, _) in steered.items()}, self.weight_of)
            decided = steer({sid: (track.controller, obs, weights[sid])
                             for sid, (session, track, obs) in steered.items()}, self.max_total_waiting)
        except Exception as exc:
            log.warning("sessions %s: no decision this tick: %s: %s", ", ".join(steered), type(exc).__name__, exc)
            decided = {}
        decisions = {}
        for sid, (new, obs) in decided.items():
            session, track, _ = steered[sid]
            try:
                await self._apply(session, track, obs, new)
            except Exception as exc:
                log.warning("session %s: rate %.1f tasks/s not applied: %s: %s", sid, new, type(exc).__name__, exc)
                continue
            decisions[sid] = new
        for gone in set(self.tracks) - {s.get("id") for s in sessions}:
            del self.tracks[gone]
            for gauge in self._gauges.values():
                for labels in [k for k in gauge._metrics if k[0] == gone]:
                    gauge.remove(*labels)
        return decisions

    async def _apply(self, session: dict[str, Any], track: SessionTrack, obs: Observation, new: float) -> None:
        """Set one session's new rate (always the first one: it lifts the start window), log it, export it."""
        track.rate.append(obs.t, new)
        if not track.decided or abs(new - obs.rate) > 0.01 * obs.rate:
            await self.manager.set_rate(session["id"], new)
            if not track.decided:
                track.decided_at = obs.t
            track.decided = True
        target = track.controller.target_depth(obs)
        self._record(session, obs, new, target)
        labels = (session["id"], session["experiment"])
        cap = math.inf if obs.max_rate is None else obs.max_rate
        for name, value in (("rate", new), ("depth", obs.depth), ("consume_rate", obs.consume_rate),
                            ("target_depth", target), ("rate_cap", cap)):
            self._gauges[name].labels(*labels).set(value)

    def _record(self, session: dict[str, Any], obs: Observation, new: float, target: float) -> None:
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        line = {"t": round(obs.t - self._t0, 3), "wall": time.time(), "depth": obs.depth,
                "broker_depth": self.broker_depth.get(session["id"]),
                "consume_rate": obs.consume_rate, "publish_rate": obs.publish_rate, "rate": obs.rate,
                "asked_rate": obs.asked_rate,
                "new_rate": new, "consumers": obs.consumers, "finished": session["finished"],
                "total": session["total"], "weight": float(session.get("weight") or 1.0), "cap": obs.max_rate,
                "target": target}
        with open(self.log_dir / f"health-{session['id']}.jsonl", "a") as handle:
            handle.write(strictjson.dumps(line) + "\n")  # strict JSON: a NaN target or rate is null

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Tick every ``period`` seconds until ``stop`` is set; a failing tick (any exception) is logged with its
        reason, not fatal: the next tick runs."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            started = self.clock()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("health tick failed (reading the sessions): %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, self.period - (self.clock() - started)))


def _decision_metrics():
    """A Prometheus registry with the controller's gauges, labelled by session and experiment, beside the process
    and platform collectors and ``labswarm_build_info`` (:mod:`labswarm.exposition`). The names carry their unit
    (issue 28: ``labswarm_health_rate`` is ``labswarm_health_publish_rate_tasks_per_second``, ``..._queue_depth``
    ``..._queue_depth_messages``, ``..._consume_rate`` ``..._consume_rate_tasks_per_second``, ``..._target_depth``
    ``..._target_depth_messages``, ``..._rate_cap`` ``..._rate_cap_tasks_per_second``)."""
    from prometheus_client import Gauge

    from labswarm.exposition import standard_registry

    registry = standard_registry()
    labels = ["session", "experiment"]
    gauges = {
        "rate": Gauge("labswarm_health_publish_rate_tasks_per_second", "Publish rate decided.", labels,
                      registry=registry),
        "depth": Gauge("labswarm_health_queue_depth_messages", "Queue depth observed.", labels, registry=registry),
        "consume_rate": Gauge("labswarm_health_consume_rate_tasks_per_second", "Consume rate measured.", labels,
                              registry=registry),
        "target_depth": Gauge("labswarm_health_target_depth_messages", "Target queue depth.", labels,
                              registry=registry),
        "rate_cap": Gauge("labswarm_health_rate_cap_tasks_per_second", "Share of the workers by weight the rate "
                          "is capped at (+Inf: uncapped).", labels, registry=registry),
    }
    return registry, gauges
