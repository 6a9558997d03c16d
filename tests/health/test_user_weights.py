"""Sessions of different users share the workers by the users' weights (labswarm.health.users): a user's weight
is split among their sessions by the sessions' own weights, so more sessions do not buy more workers and one
user's sessions keep their ratios; the health loop's steer gets these weights (a real HealthLoop, its share
function observed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from labswarm.health.loop import HealthLoop
from labswarm.health.users import session_weights


def test_a_user_s_weight_is_split_among_their_sessions_by_their_own_weights() -> None:
    weights = session_weights({"a1": ("alice", 1.0), "a2": ("alice", 1.0), "a3": ("alice", 2.0), "b1": ("bob", 1.0)},
                              lambda user: 1.0)
    assert weights == pytest.approx({"a1": 0.25, "a2": 0.25, "a3": 0.5, "b1": 1.0})  # alice: 1 in all
    assert sum(w for sid, w in weights.items() if sid.startswith("a")) == pytest.approx(weights["b1"])
    heavy = session_weights({"a1": ("alice", 1.0), "b1": ("bob", 3.0), "o": (None, 1.0)},
                            {"alice": 2.0, "bob": 1.0, "admin": 1.0}.__getitem__)
    assert heavy == pytest.approx({"a1": 2.0, "b1": 1.0, "o": 1.0})  # a session without owner is the admin's


class _TwoUsers:
    """A stand-in for :class:`ManagerMonitor`: alice's session ``a`` and bob's ``b``, both of weight 1, whose
    workers finish 30 and 10 samples/s."""

    def __init__(self) -> None:
        self.t = 0.0
        self.rates: dict[str, float] = {}

    async def sessions(self) -> list[dict]:
        speed, owner = {"a": 30.0, "b": 10.0}, {"a": "alice", "b": "bob"}
        return [{"id": sid, "experiment": sid, "queue": f"labswarm.{sid}", "status": "running", "weight": 1.0,
                 "owner": owner[sid], "total": 10_000, "published": int(speed[sid] * self.t) + 50, "republished": 0,
                 "cached": 0, "finished": int(speed[sid] * self.t) + 1, "pending": 49,
                 "rate": self.rates.get(sid, 100.0)} for sid in "ab"]

    async def set_rate(self, session_id: str, rate: float) -> None:
        self.rates[session_id] = rate


def test_the_loop_shares_the_workers_by_the_owners_weights(tmp_path: Path) -> None:
    manager = _TwoUsers()
    clock = iter(range(100))
    loop = HealthLoop(manager, None, consumers=2, log_dir=tmp_path,  # type: ignore[arg-type]
                      clock=lambda: float(next(clock)), user_weight={"alice": 1.0, "bob": 3.0}.__getitem__)

    async def run() -> None:
        for t in range(8):
            manager.t = float(t)
            await loop.tick()

    asyncio.run(run())
    # 40 samples/s finished in all; equal session weights, but bob weighs 3: alice's session capped at a quarter
    assert manager.rates["a"] == pytest.approx(10.0, rel=0.05)
    row = json.loads((tmp_path / "health-a.jsonl").read_text().splitlines()[-1])
    assert row["cap"] == pytest.approx(10.0, rel=0.05)


def test_the_loop_reads_the_users_weights_from_the_manager_with_an_admin_s_overrides(tmp_path: Path) -> None:
    """A real manager (uvicorn, SQLite, named tokens): the weight an admin sets with ``PUT /v1/quotas/{user}``
    reaches the loop at its next reading (every WEIGHTS_EVERY_S of its clock), any other user has the default;
    with a user's token (403) the loop keeps its own ``user_weight``."""
    from jobs.manager import manager

    from labswarm.auth.tokens import add_token
    from labswarm.health.loop import WEIGHTS_EVERY_S
    from labswarm.health.monitors import ManagerMonitor

    tokens = tmp_path / "tokens.yaml"
    keys = {name: add_token(tokens, name, role) for name, role in (("root", "admin"), ("alice", "user"))}
    with manager(tmp_path, tokens_file=tokens) as m:
        admin = {"Authorization": f"Bearer {keys['root']}"}

        def put(weight: float) -> None:
            answer = m.http.put("/v1/quotas/bob", json={"weight": weight}, headers=admin)
            assert answer.status_code == 200, answer.text

        async def main() -> list[float]:
            seen = []
            loop = HealthLoop(ManagerMonitor(m.server.url, keys["root"]), None, log_dir=tmp_path,
                              user_weight=lambda _user: 2.0, weights_from_manager=True)
            mine = HealthLoop(ManagerMonitor(m.server.url, keys["alice"]), None, log_dir=tmp_path,
                              user_weight=lambda _user: 2.0, weights_from_manager=True)
            put(3.0)
            await loop.refresh_weights(0.0)
            seen += [loop.weight_of("bob"), loop.weight_of("carol")]
            put(5.0)
            await loop.refresh_weights(WEIGHTS_EVERY_S / 2)  # too soon: the last reading stands
            seen.append(loop.weight_of("bob"))
            await loop.refresh_weights(WEIGHTS_EVERY_S)
            seen.append(loop.weight_of("bob"))
            await mine.refresh_weights(0.0)
            seen.append(mine.weight_of("bob"))
            await loop.manager.aclose()
            await mine.manager.aclose()
            return seen

        seen = asyncio.run(main())
    assert seen == [3.0, 1.0, 3.0, 5.0, 2.0]
