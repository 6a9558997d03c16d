"""Sessions of different users share the workers by the users' weights (issue 26): each user's fair-share weight
(:mod:`labswarm.auth.quotas`, the one the training jobs' queue uses) is split among that user's running sessions
by the sessions' own weights, so a user who starts more sessions does not get more of the workers, and the
sessions of one user keep their ratios. This is a two-level hierarchy as in YARN's Fair Scheduler (a queue per
user, the applications within it) and Slurm's fair-share tree (accounts, then users)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from labswarm.sessions.models import DEFAULT_OWNER


def session_weights(sessions: Mapping[str, tuple[str | None, float]],
                    user_weight: Callable[[str], float]) -> dict[str, float]:
    """Each session's weight in the workers' split: ``user_weight(owner) * weight / (sum of the weights of that
    owner's sessions here)``.

    Args:
        sessions: by session id, its owner (``None``: :data:`~labswarm.sessions.models.DEFAULT_OWNER`) and its
            own weight (> 0).
        user_weight: a user's fair-share weight (> 0).

    Returns:
        The effective weight of each session (> 0), by session id; one user's sum to their weight.
    """
    totals: dict[str, float] = {}
    for owner, weight in sessions.values():
        totals[owner or DEFAULT_OWNER] = totals.get(owner or DEFAULT_OWNER, 0.0) + weight
    return {sid: user_weight(owner or DEFAULT_OWNER) * weight / totals[owner or DEFAULT_OWNER]
            for sid, (owner, weight) in sessions.items()}
