"""Sessions that share one pool of workers: a share of the workers by weight, and one budget of waiting messages.

A worker subscribed to several queues takes from them in turn (RabbitMQ delivers round robin across a channel's
consumers), so while every queue holds messages each session gets about the same part of the workers, whatever
the publish rates. A session gets less than that only by publishing less: a queue fed below the rate the workers
would drain it at runs empty and is consumed at exactly its publish rate, and the workers spend the rest of their
time on the other queues. Weighted shares therefore come from caps:

1. The capacity of the pool is the sum of the sessions' measured consume rates (samples/s). It is the true
   capacity as long as one queue holds messages, which the uncapped sessions below see to.
2. That capacity is split by weighted max-min fairness (water filling) over the sessions that still have
   samples to publish: a session whose own ``max_rate`` is below its weighted part gets that, and the rest is
   split again by weight among the others.
3. Every session held below what it asks for, except those of the highest weight among them, is capped at its
   part (:attr:`Observation.max_rate`). The highest-weight sessions are left uncapped: their controllers keep
   their queues at the target depth, which keeps the workers busy (so the measured capacity is the true one,
   and it follows workers joining or leaving), and they take what the capped sessions leave, split equally
   among them by the round robin, as their equal weights ask. With equal weights nobody is capped: the round
   robin alone shares the workers, and each controller only keeps its queue short.

The total of waiting messages is bounded by scaling the sessions' target depths down, in proportion, until they
sum to at most ``max_total_waiting`` (:attr:`Observation.max_target`); ``None`` or 0 is no budget.

Every session one health process steers is taken to share one pool of workers (each worker consumes every
session's queue, ``labswarm worker --experiment a --experiment b``). Pools that share nothing are steered by a
health process each (or given equal weights, which caps nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from labswarm.health.controllers.base import Controller, Observation

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Claim:
    """What one session asks of the shared workers.

    Attributes:
        weight: the session's weight (> 0); shares are proportional to weights.
        consume_rate: samples/s the workers finish of this session now (measured).
        target: the session's own target queue depth in messages (before the budget).
        publishing: the session still has samples to publish (only those are capped).
        demand: the most the session would publish, samples/s (its controller's ``max_rate``).
    """

    weight: float
    consume_rate: float
    target: float
    publishing: bool = True
    demand: float = float("inf")


@dataclass(frozen=True, slots=True)
class Limit:
    """What one session is held to.

    Attributes:
        rate: the highest publish rate in samples/s, or ``None`` when uncapped.
        target: the highest target queue depth in messages, or ``None`` without a budget.
        share: the session's weighted part of the measured capacity, samples/s (``None`` when not publishing).
    """

    rate: float | None = None
    target: float | None = None
    share: float | None = None


def weighted_max_min(capacity: float, weights: Mapping[K, float], demands: Mapping[K, float]) -> dict[K, float]:
    """Weighted max-min fair split of ``capacity`` (water filling).

    Each key gets ``capacity * weight / sum(weights)``, except that a key demanding less gets its demand and
    what it leaves is split again, by weight, among the others.

    Args:
        capacity: what there is to share, samples/s (< 0 counts as 0).
        weights: weight of each key, > 0.
        demands: the most each key can use, samples/s (``inf`` for no limit).

    Returns:
        The part of each key, samples/s; they sum to at most ``capacity``.

    Raises:
        ValueError: a weight is not > 0.
    """
    if any(not w > 0 for w in weights.values()):
        raise ValueError(f"weights must be > 0: {dict(weights)}")
    remaining = max(0.0, capacity)
    active = set(weights)
    out: dict[K, float] = {}
    while active:
        total = sum(weights[k] for k in active)
        satisfied = [k for k in active if demands[k] <= remaining * weights[k] / total]
        if not satisfied:
            out.update({k: remaining * weights[k] / total for k in active})
            break
        for k in satisfied:
            out[k] = max(0.0, demands[k])
            remaining -= out[k]
            active.discard(k)
    return out


def fair_limits(claims: Mapping[K, Claim], max_total_waiting: float | None = None) -> dict[K, Limit]:
    """The cap and the target bound of every session sharing one pool of workers (see the module docstring).

    Args:
        claims: every steered session.
        max_total_waiting: the budget of messages waiting in all the sessions' queues together; ``None`` or 0:
            no budget (each session keeps its own target).

    Returns:
        A :class:`Limit` per session.
    """
    publishing = {k: c for k, c in claims.items() if c.publishing}
    shares: dict[K, float] = {}
    caps: dict[K, float | None] = dict.fromkeys(claims)
    if publishing:
        capacity = sum(max(0.0, c.consume_rate) for c in publishing.values())
        shares = weighted_max_min(capacity, {k: c.weight for k, c in publishing.items()},
                                  {k: c.demand for k, c in publishing.items()})
        held = [k for k in publishing if shares[k] < publishing[k].demand]
        if held:
            top = max(publishing[k].weight for k in held)
            for k in held:
                if publishing[k].weight < top * (1 - 1e-9):
                    caps[k] = shares[k]
    targets: dict[K, float | None] = dict.fromkeys(claims)
    total_target = sum(c.target for c in claims.values())
    if max_total_waiting and total_target > 0:  # None or 0: no budget
        targets = {k: max_total_waiting * c.target / total_target for k, c in claims.items()}
    return {k: Limit(rate=caps[k], target=targets[k], share=shares.get(k)) for k in claims}


def steer(sessions: Mapping[K, tuple[Controller, Observation, float]],
          max_total_waiting: float | None = None) -> dict[K, tuple[float, Observation]]:
    """One decision for every session sharing the workers: their limits, then each controller's new rate.

    Args:
        sessions: per session, its controller, its observation (without limits) and its weight.
        max_total_waiting: the budget of waiting messages of all the sessions together; ``None`` or 0: none.

    Returns:
        Per session, the new publish rate in samples/s and the observation with its limits, as the controller
        saw it.
    """
    claims = {k: Claim(weight=w, consume_rate=obs.consume_rate, target=ctl.target_depth(obs),
                       publishing=obs.backlog > 0, demand=ctl.config.max_rate)
              for k, (ctl, obs, w) in sessions.items()}
    limits = fair_limits(claims, max_total_waiting)
    out = {}
    for k, (ctl, obs, _) in sessions.items():
        limited = dataclasses.replace(obs, max_rate=limits[k].rate, max_target=limits[k].target)
        out[k] = (ctl.update(limited), limited)
    return out
