"""The quota admin API (issue 26, item 1): an admin reads and sets each user's fair-share weight and quotas while
the manager runs; a user gets 403.

- ``GET /v1/quotas``: the default policy and every user with one of their own;
- ``GET /v1/quotas/{user}``: one user's policy as applied now, and what an admin set of it;
- ``PUT /v1/quotas/{user}``: replace what an admin set for the user (``{"weight": 2, "quotas": {"workers": 4}}``;
  a quota set to ``null`` lifts it for the user, one left out keeps the settings' or the tokens file's);
- ``DELETE /v1/quotas/{user}``: remove what an admin set: the user is back to the settings and the tokens file.

The overrides are stored in the manager's database (:mod:`labswarm.auth.overrides`) and hold from the next request
or scheduling pass: a submission or a session start is checked against the new quotas, a queued job waits or
starts by them, and fair share uses the new weight. Lowering a quota stops nothing that runs or is queued; a
job that could then never start fails at the next scheduling pass (C104).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from labswarm.auth.authenticator import require_admin
from labswarm.auth.overrides import PolicyStore
from labswarm.auth.quotas import Policy
from labswarm.auth.tokens import NAME, User

router = APIRouter(prefix="/v1/quotas", tags=["quotas"])
UserName = Annotated[str, Path(pattern=NAME.pattern, description="a user name (as in the tokens file)")]
Admin = Annotated[User, Depends(require_admin)]


class QuotaValues(BaseModel):
    """A user's quotas (each ``null``: no quota). In a ``PUT``, only the quotas given are set."""

    model_config = ConfigDict(extra="forbid")
    running_learners: int | None = Field(None, ge=0, description="learners holding slots at once")
    gpus: int | None = Field(None, ge=0, description="GPUs held by running learners at once")
    queued_jobs: int | None = Field(None, ge=0, description="jobs queued at once")
    active_sessions: int | None = Field(None, ge=0, description="sessions running or paused at once")
    workers: int | None = Field(None, ge=0, description="workers the manager runs for their sessions at once")


class PolicyBody(BaseModel):
    """What an admin sets for a user (``PUT /v1/quotas/{user}``): replaces what was set before."""

    model_config = ConfigDict(extra="forbid")
    weight: float | None = Field(None, gt=0, description="fair-share weight; null or left out: not set")
    quotas: QuotaValues = Field(default_factory=QuotaValues, description="the quotas set, by name")


class Quotas(BaseModel):
    """A user's quotas as applied now (each ``null``: no quota); the names as :class:`QuotaValues`'."""

    model_config = ConfigDict(extra="forbid")
    running_learners: int | None
    gpus: int | None
    queued_jobs: int | None
    active_sessions: int | None
    workers: int | None


class Overrides(BaseModel):
    """What an admin set for a user."""

    model_config = ConfigDict(extra="forbid")
    weight: float | None = Field(description="the weight set; null: not set")
    quotas: dict[str, int | None] = Field(description="the quotas set, by name (null: lifted)")


class UserPolicy(BaseModel):
    """A user's policy as the manager applies it now, and what an admin set of it."""

    model_config = ConfigDict(extra="forbid")
    user: str
    weight: float = Field(description="fair-share weight (> 0): the user's due share of the learner slots and of "
                                      "shared workers is weight / the sum of the weights of the users who want some")
    quotas: Quotas
    overrides: Overrides


class QuotaList(BaseModel):
    """The default policy and every user with one of their own (tokens file, settings or an admin's)."""

    model_config = ConfigDict(extra="forbid")
    default: UserPolicy = Field(description="the policy of any user not listed (user '*')")
    users: list[UserPolicy]


def _store(request: Request) -> PolicyStore:
    """The manager's policy store (the sessions' service's, shared with the jobs' scheduler)."""
    return request.app.state.sessions.policies


Store = Annotated[PolicyStore, Depends(_store)]


def _view(user: str, policy: Policy, overrides: dict[str, Any]) -> dict[str, Any]:
    quotas = {k: v for k, v in asdict(policy).items() if k != "weight"}
    return {"user": user, "weight": policy.weight, "quotas": quotas, "overrides": overrides}


@router.get("")
def list_quotas(_admin: Admin, store: Store) -> dict[str, Any]:
    """The default policy (the settings') and every user with a policy of their own, by name."""
    return {"default": _view("*", store.base.default, {"weight": None, "quotas": {}}),
            "users": [_view(name, store.of(name), store.overrides(name)) for name in store.users()]}


@router.get("/{user}")
def show_quotas(user: UserName, _admin: Admin, store: Store) -> dict[str, Any]:
    """``user``'s weight and quotas as applied now (any name: a user without a policy of their own has the
    default one), and what an admin set of them."""
    return _view(user, store.of(user), store.overrides(user))


@router.put("/{user}")
def set_quotas(user: UserName, body: PolicyBody, admin: Admin, store: Store) -> dict[str, Any]:
    """Replace what an admin set for ``user`` by ``body``; it holds from the next request or scheduling pass."""
    policy = store.set(user, body.weight, body.quotas.model_dump(exclude_unset=True), by=admin.name)
    return _view(user, policy, store.overrides(user))


@router.delete("/{user}")
def clear_quotas(user: UserName, _admin: Admin, store: Store) -> dict[str, Any]:
    """Remove what an admin set for ``user``: the settings' and the tokens file's policy again."""
    policy = store.clear(user)
    return _view(user, policy, store.overrides(user))
