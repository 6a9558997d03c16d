"""Per-user quotas and fair-share weights: how much of the manager one user may hold at once, and how much of
the learner slots each user is due relative to the others.

Defaults come from the settings (``LABSWARM_QUOTA_*``, ``LABSWARM_USER_WEIGHTS``; none: no quota, weight 1);
a user of the tokens file (:mod:`labswarm.auth.tokens`) may carry their own::

    tokens:
      - name: alice
        role: user
        token_sha256: 3f7a...
        weight: 2                    # twice the others' share of the learner slots
        quotas:                      # each key optional; null: no quota for alice
          running_learners: 4        # learners holding slots at once: a job past it waits (reason shown)
          gpus: 2                    # GPUs held by running learners at once: the same
          queued_jobs: 20            # jobs waiting in the queue: a submission past it is a 429
          active_sessions: 1         # sessions running or paused: a start past it is a 429
          workers: 8                 # workers the manager runs for the user's sessions: a start or a scale
                                     # past it is a 429

An admin may also set a user's weight and quotas at run time over the API (``/v1/quotas/{user}``,
:mod:`labswarm.auth.overrides`): those win over the tokens file and the settings.

Quotas bound what a user *holds* (admission control, as the per-user limits of Slurm's associations or YARN's
``maxRunningApps``); weights share what is free between those who wait (weighted fair share:
:mod:`labswarm.jobs.lifecycle.fairshare`). A quota counts the user's own jobs and sessions only, whoever they are
(an admin included): ``0`` forbids, ``None`` does not count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labswarm.auth.tokens import raw_entries
from labswarm.errors import ConfigError, LabswarmError, format_loc
from labswarm.settings import Settings

#: The quotas a user may have, each with what it counts (used in messages).
QUOTAS: dict[str, str] = {"running_learners": "learners holding slots", "gpus": "GPUs held by running learners",
                          "queued_jobs": "jobs queued", "active_sessions": "sessions running or paused",
                          "workers": "workers the manager runs for their sessions"}


class QuotaExceeded(LabswarmError):
    """A request that would take a user past one of their quotas (HTTP 429, the quota named).

    Attributes:
        user: whose quota.
        quota: its name, one of :data:`QUOTAS`.
        limit: the quota.
        used: what the user holds now.
    """

    def __init__(self, user: str, quota: str, limit: int, used: int) -> None:
        self.user, self.quota, self.limit, self.used = user, quota, limit, used
        super().__init__(f"quota {quota} of {user} reached: {used} {QUOTAS[quota]} of {limit} allowed "
                         f"(LABSWARM_QUOTA_{quota.upper()}, 'quotas: {{{quota}: N}}' in the tokens file, or an admin's "
                         f"PUT /v1/quotas/{user})")


@dataclass(frozen=True)
class Policy:
    """One user's weight and quotas (``None``: no quota).

    Attributes:
        weight: fair-share weight (> 0; 1 by default): the user's due share of the slots is weight / sum of the
            weights of the users who wait or run.
        running_learners: learners of the user's jobs holding slots at once.
        gpus: GPUs held by the user's running learners at once (``resources.gpus`` x learners).
        queued_jobs: the user's jobs in the queue at once.
        active_sessions: the user's sessions running or paused at once.
        workers: workers the manager runs for the user's sessions at once (the ``workers`` a session was started
            or last scaled with, over its launcher; workers started outside the manager are not counted).
    """

    weight: float = 1.0
    running_learners: int | None = None
    gpus: int | None = None
    queued_jobs: int | None = None
    active_sessions: int | None = None
    workers: int | None = None

    def check(self, user: str, quota: str, used: int, adding: int = 1) -> None:
        """Raise :class:`QuotaExceeded` when ``used + adding`` passes the quota ``quota`` (one of :data:`QUOTAS`).

        Raises:
            QuotaExceeded: over the quota.
        """
        limit = getattr(self, quota)
        if limit is not None and used + adding > limit:
            raise QuotaExceeded(user, quota, limit, used)


class _Quotas(BaseModel):
    """The ``quotas`` mapping of one tokens-file entry."""

    model_config = ConfigDict(extra="forbid")
    running_learners: int | None = Field(None, ge=0)
    gpus: int | None = Field(None, ge=0)
    queued_jobs: int | None = Field(None, ge=0)
    active_sessions: int | None = Field(None, ge=0)
    workers: int | None = Field(None, ge=0)


class _Entry(BaseModel):
    """What this module reads of one tokens-file entry (the rest is :mod:`labswarm.auth.tokens`')."""

    model_config = ConfigDict(extra="ignore")
    name: str
    weight: float | None = Field(None, gt=0)
    quotas: _Quotas | None = None


class Policies:
    """Every user's :class:`Policy`: the settings' defaults, each user's overrides.

    Args:
        default: the policy of a user without overrides.
        users: the overrides, by user name (whole policies).
    """

    def __init__(self, default: Policy | None = None, users: dict[str, Policy] | None = None) -> None:
        self.default = default or Policy()
        self.users = dict(users or {})

    def of(self, user: str) -> Policy:
        """``user``'s policy."""
        return self.users.get(user, self.default)

    def weight(self, user: str) -> float:
        """``user``'s fair-share weight."""
        return self.of(user).weight

    @classmethod
    def from_settings(cls, settings: Settings) -> Policies:
        """The quotas ``LABSWARM_QUOTA_*``, the weights ``LABSWARM_USER_WEIGHTS``, then each tokens-file entry's
        ``weight`` and ``quotas`` (a key it sets wins; one it leaves out keeps the default).

        Raises:
            ConfigError: an invalid ``weight`` or ``quotas`` (the field named ``tokens[i].quotas.key``).
        """
        default = Policy(running_learners=settings.quota_running_learners, gpus=settings.quota_gpus,
                         queued_jobs=settings.quota_queued_jobs, active_sessions=settings.quota_active_sessions,
                         workers=settings.quota_workers)
        users = {name: replace(default, weight=weight) for name, weight in settings.user_weights.items()}
        if settings.tokens_file is not None:
            for i, item in enumerate(raw_entries(settings.tokens_file)):
                users.update(_override(i, item, users, default))
        return cls(default, users)


def _override(i: int, item: Any, users: dict[str, Policy], default: Policy) -> dict[str, Policy]:
    """The policy tokens-file entry ``i`` gives its user (nothing when it sets neither weight nor quotas)."""
    if not isinstance(item, dict) or ("weight" not in item and "quotas" not in item):
        return {}
    try:
        entry = _Entry.model_validate(item)
    except ValidationError as exc:
        raise ConfigError([(f"tokens[{i}]." + format_loc(e["loc"]), e["msg"]) for e in exc.errors()]) from None
    policy = users.get(entry.name, default)
    if entry.weight is not None:
        policy = replace(policy, weight=entry.weight)
    if entry.quotas is not None:
        policy = replace(policy, **entry.quotas.model_dump(exclude_unset=True))
    return {entry.name: policy}

