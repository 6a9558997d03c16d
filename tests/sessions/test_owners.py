"""Owners of experiments and sessions over real HTTP (issue 11, items 2, 4 and 6): a manager with the admin's
``LABSWARM_API_TOKEN`` and two users of a tokens file (alice, bob), a real RabbitMQ for alice's session.

Per endpoint of the sessions' router: no token is a 401; bob (a user) gets a 404 (an empty list for listings)
for alice's experiment and session, the same as for ones that do not exist; alice gets hers; the admin (what the
workers use) sees and controls everything. Also: a taken experiment name, outcomes of another session's samples
(rejected, not in the ledger), and a stored experiment whose paths left the data roots (invalid, not served, no
session; the others run)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import delete_queue, experiment_dict

from labswarm.auth.tokens import add_token
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.app import queue_name
from labswarm.sessions import ledger
from labswarm.sessions.models import SampleRow, SessionRow
from labswarm.sessions.service import SessionService
from labswarm.settings import Settings

ADMIN = "admin-t0ken_of-the-workers"


class Manager:
    """The running manager, a client per caller, and alice's experiment and session."""

    def __init__(self, url: str, service: SessionService, tokens: dict[str, str]) -> None:
        self.url, self.service, self.tokens = url, service, tokens
        self.experiment = self.session = ""

    def as_(self, who: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def call(self, who: str | None, method: str, path: str, body: dict | None = None) -> httpx.Response:
        with self.as_(who) as http:
            return http.request(method, path, json=body)


@pytest.fixture
def manager(tmp_path: Path, tone_dataset: Path) -> Iterator[Manager]:
    tokens_file = tmp_path / "tokens.yaml"
    tokens = {"admin": ADMIN, "alice": add_token(tokens_file, "alice"), "bob": add_token(tokens_file, "bob")}
    app = create_app(Settings(home=tmp_path / "home", api_token=ADMIN, tokens_file=tokens_file))
    with EmbeddedServer(app) as server:
        m = Manager(server.url, app.state.sessions, tokens)
        m.experiment = f"own-{uuid.uuid4().hex[:8]}"  # queues are global on the shared broker
        response = m.call("alice", "POST", "/experiments",
                          experiment_dict(tone_dataset, tmp_path / "store", name=m.experiment))
        assert response.status_code == 201, response.text
        response = m.call("alice", "POST", f"/experiments/{m.experiment}/sessions", {"rate": 0.01})
        assert response.status_code == 201, response.text
        m.session = response.json()["id"]
        try:
            yield m
        finally:
            m.call("admin", "POST", f"/sessions/{m.session}/cancel")
    delete_queue(app.state.sessions.settings.broker_url, queue_name(m.experiment))


def test_experiments_and_sessions_record_their_owner(manager: Manager) -> None:
    experiment = manager.call("alice", "GET", f"/experiments/{manager.experiment}").json()
    assert (experiment["owner"], experiment["valid"], experiment["problem"]) == ("alice", True, None)
    assert manager.call("alice", "GET", f"/sessions/{manager.session}").json()["owner"] == "alice"
    assert manager.service.session(manager.session).owner == "alice"


def _endpoints(m: Manager) -> list[tuple[str, str, dict | None]]:
    """(method, path, body) of every route on one of alice's objects."""
    e, s = m.experiment, m.session
    return [("GET", f"/experiments/{e}", None), ("GET", f"/experiments/{e}/config", None),
            ("POST", f"/experiments/{e}/sessions", {"rate": 0.01}),
            ("GET", f"/sessions/{s}", None), ("PUT", f"/sessions/{s}/rate", {"rate": 0.02}),
            ("PUT", f"/sessions/{s}/weight", {"weight": 2.0}), ("PUT", f"/sessions/{s}/workers", {"workers": 1}),
            ("POST", f"/sessions/{s}/pause", None), ("POST", f"/sessions/{s}/resume", None),
            ("GET", f"/sessions/{s}/failures", None), ("GET", f"/sessions/{s}/series", None),
            ("POST", f"/sessions/{s}/outcomes", {"outcomes": []}),
            ("POST", f"/sessions/{s}/redeliveries", {"sample_id": "x"})]


def test_each_route_on_one_object_is_401_without_a_token_404_for_another_user(manager: Manager) -> None:
    events = ("GET", f"/sessions/{manager.session}/events", None)  # a stream: its owner's never ends here
    for method, path, body in [*_endpoints(manager), events]:
        assert manager.call(None, method, path, body).status_code == 401, (method, path)
        response = manager.call("bob", method, path, body)
        assert response.status_code == 404, (method, path, response.text)
        # the same answer as for an object that does not exist: existence is not disclosed
        missing = path.replace(manager.experiment, "nothing-here").replace(manager.session, "nothing00000")
        assert manager.call("bob", method, missing, body).json() == {
            "detail": response.json()["detail"].replace(manager.experiment, "nothing-here")
            .replace(manager.session, "nothing00000")}, (method, path)
    # nothing of bob's calls changed alice's session
    assert manager.service.session(manager.session).status == "running"
    assert manager.service.session(manager.session).rate == 0.01


def test_the_owner_and_the_admin_reach_each_route(manager: Manager) -> None:
    for who in ("alice", "admin"):
        for method, path, body in _endpoints(manager):
            response = manager.call(who, method, path, body)
            if path.endswith("/sessions") or path.endswith("/workers"):
                # a second active session, or no launcher to scale: refused for what the session is, not hidden
                assert response.status_code == 409, (who, method, path, response.text)
                continue
            assert response.status_code == 200, (who, method, path, response.text)


def test_listings_show_the_callers_own_and_the_admin_everything(manager: Manager) -> None:
    for path in ("/experiments", "/sessions"):
        assert manager.call(None, "GET", path).status_code == 401
        assert manager.call("bob", "GET", path).json() == []
        mine = manager.call("alice", "GET", path).json()
        assert [x["owner"] for x in mine] == ["alice"]
        key = "name" if path == "/experiments" else "id"
        assert [x[key] for x in manager.call("admin", "GET", path).json()] == [x[key] for x in mine]
    # an admin's own session: the admin lists it beside alice's, alice does not see it
    with manager.service.db() as db:
        db.add(SessionRow(id="admin000", experiment=manager.experiment, status="completed", rate=1.0,
                          fingerprint="f", owner="admin"))
        db.commit()
    assert {s["id"] for s in manager.call("admin", "GET", "/sessions").json()} == {manager.session, "admin000"}
    assert [s["id"] for s in manager.call("alice", "GET", "/sessions").json()] == [manager.session]
    assert manager.call("alice", "GET", "/sessions/admin000").status_code == 404


def test_a_name_taken_by_another_user_is_refused_without_naming_the_owner(manager: Manager, tmp_path: Path,
                                                                          tone_dataset: Path) -> None:
    config = experiment_dict(tone_dataset, tmp_path / "store", name=manager.experiment, seed=7)
    response = manager.call("bob", "POST", "/experiments", config)
    assert response.status_code == 409 and "taken" in response.json()["detail"]
    assert "alice" not in response.text
    assert manager.call("bob", "GET", "/experiments").json() == []
    # alice may register it again (same configuration: her session stays), and it stays hers
    same = experiment_dict(tone_dataset, tmp_path / "store", name=manager.experiment)
    assert manager.call("alice", "POST", "/experiments", same).json()["owner"] == "alice"


def test_outcomes_of_another_sessions_samples_are_rejected_and_not_recorded(manager: Manager) -> None:
    """Item 6: the batch names alice's sample, a sample of another session and an unknown id: only alice's is
    recorded; the others come back with the reason and the ledger of neither session holds them."""
    service = manager.service
    with service.db() as db:
        db.add(SessionRow(id="other000", experiment=manager.experiment, status="completed", rate=1.0,
                          fingerprint="f", owner="alice"))
        db.flush()
        ledger.add_samples(db, manager.session, [("mine#0", "published", None)])
        ledger.add_samples(db, "other000", [("theirs#0", "published", None)])
        db.commit()
    response = manager.call("admin", "POST", f"/sessions/{manager.session}/outcomes", {"outcomes": [
        {"sample_id": "mine#0", "status": "computed", "seconds": 0.1},
        {"sample_id": "theirs#0", "status": "computed"},
        {"sample_id": "../../etc/passwd#0", "status": "failed", "reason": "forged"}]})
    assert response.status_code == 200
    reason = f"not a sample of session {manager.session}"
    assert response.json() == {"applied": 1, "rejected": [{"sample_id": "theirs#0", "reason": reason},
                                                          {"sample_id": "../../etc/passwd#0", "reason": reason}]}
    with service.db() as db:
        rows = {(r.session_id, r.sample_id): r.status for r in db.query(SampleRow).filter(
            SampleRow.sample_id.in_(["mine#0", "theirs#0", "../../etc/passwd#0"]))}
    assert rows == {(manager.session, "mine#0"): "done", ("other000", "theirs#0"): "published"}


def test_an_experiment_outside_the_data_roots_is_invalid_not_served_and_cannot_start(
        manager: Manager, tmp_path: Path) -> None:
    """A stored experiment whose paths lie outside the roots of a manager started later: listed with
    ``valid: false`` and the reason, its configuration refused to workers, no session."""
    settings = manager.service.settings
    assert manager.call("alice", "POST", f"/sessions/{manager.session}/cancel").status_code == 200
    outside = tmp_path.parent / "elsewhere"
    moved = Settings(home=settings.home, api_token=ADMIN, tokens_file=settings.tokens_file,
                     data_roots=[str(outside)])
    later = SessionService(moved, engine=manager.service.engine)  # the same database, other roots
    problems = later.registry.problems()
    assert list(problems) == [manager.experiment] and "outside the allowed data roots" in problems[manager.experiment]
    app = create_app(moved, later)
    with EmbeddedServer(app) as server, httpx.Client(base_url=server.url, timeout=30.0,
                                                     headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        [listed] = http.get("/experiments").json()
        assert (listed["valid"], listed["problem"]) == (False, problems[manager.experiment])
        config = http.get(f"/experiments/{manager.experiment}/config")
        assert config.status_code == 409 and "outside the allowed data roots" in config.text
        assert http.post(f"/experiments/{manager.experiment}/sessions", json={"rate": 1.0}).status_code == 422
    # the manager that still has the roots serves it
    assert manager.call("admin", "GET", f"/experiments/{manager.experiment}/config").status_code == 200
