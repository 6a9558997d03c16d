"""The session state machine (labswarm/sessions/states.py) and its one write point (labswarm/sessions/lifecycle.py):
every transition of the table is accepted there, every other one is refused there and leaves the row as it was,
the terminal states have no way out; then the same rules through the service, on a real SQLite database."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import get_args

import pytest
from helpers import experiment_dict, write_dataset

from labswarm.errors import Conflict, NotFound
from labswarm.sample import Sample
from labswarm.sessions import lifecycle
from labswarm.sessions.api import SessionStatus
from labswarm.sessions.models import ACTIVE_SQL, SessionRow
from labswarm.sessions.queries import SESSION_STATUSES
from labswarm.sessions.service import SessionService
from labswarm.sessions.states import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    InvalidTransition,
    SessionState,
    check_transition,
)
from labswarm.settings import Settings

ALLOWED = [(old, new) for old, targets in TRANSITIONS.items() for new in sorted(targets)]
FORBIDDEN = [(old, new) for old, new in itertools.product(SessionState, SessionState) if new not in TRANSITIONS[old]]


def _row(state: SessionState) -> SessionRow:
    return SessionRow(id="s1", experiment="e", status=state.value, rate=1.0, fingerprint="f")


def test_the_table_covers_every_state_and_names_the_terminal_and_active_sets_once() -> None:
    assert set(TRANSITIONS) == set(SessionState)
    assert {state for state, targets in TRANSITIONS.items() if not targets} == TERMINAL
    assert set(ACTIVE) == set(SessionState) - TERMINAL
    assert ALLOWED and FORBIDDEN  # the parametrized tests below run on something


def test_states_are_their_stored_strings() -> None:
    """Stored values, REST payloads and the other packages' string comparisons stay the same strings."""
    assert [state.value for state in SessionState] == ["running", "paused", "completed", "cancelled", "failed"]
    assert SessionState.RUNNING == "running" and "paused" in ACTIVE
    assert json.dumps({"status": SessionState.CANCELLED}) == '{"status": "cancelled"}'
    assert set(get_args(SessionStatus)) == set(SESSION_STATUSES) == {state.value for state in SessionState}
    assert ACTIVE_SQL == "status IN ('running', 'paused')"  # the partial unique index of revision 0002


@pytest.mark.parametrize(("old", "new"), ALLOWED, ids=[f"{o}->{n}" for o, n in ALLOWED])
def test_each_allowed_transition_is_accepted_at_the_write_point(old: SessionState, new: SessionState) -> None:
    row = _row(old)
    assert lifecycle.transition(row, new, error="why" if new is SessionState.FAILED else None) is new
    assert row.status == new.value and type(row.status) is str  # stored as the plain string
    assert (row.finished_at is not None) == (new in TERMINAL)
    assert row.error == ("why" if new is SessionState.FAILED else None)


@pytest.mark.parametrize(("old", "new"), FORBIDDEN, ids=[f"{o}->{n}" for o, n in FORBIDDEN])
def test_each_other_transition_is_refused_at_the_write_point(old: SessionState, new: SessionState) -> None:
    row = _row(old)
    with pytest.raises(InvalidTransition, match=f"a {old} session cannot become {new}") as caught:
        lifecycle.transition(row, new, error="why")
    assert isinstance(caught.value, Conflict)  # answered 409 by the manager
    assert (caught.value.old, caught.value.new) == (old, new)
    assert row.status == old.value and row.finished_at is None and row.error is None  # left as it was


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_have_no_way_out(terminal: SessionState) -> None:
    assert TRANSITIONS[terminal] == frozenset()
    for new in SessionState:
        with pytest.raises(InvalidTransition, match="none: it is terminal"):
            check_transition(terminal, new)
    row = _row(terminal)
    assert lifecycle.end(row, SessionState.FAILED, error="late") is False  # an ended session keeps its end
    assert row.status == terminal.value and row.error is None


def test_unknown_states_and_non_terminal_ends_are_refused() -> None:
    with pytest.raises(InvalidTransition, match="unknown state 'draining'"):
        check_transition("running", "draining")
    with pytest.raises(InvalidTransition, match="unknown state 'stopped'"):
        lifecycle.transition(SessionRow(id="s1", status="stopped"), SessionState.RUNNING)
    row = _row(SessionState.RUNNING)
    with pytest.raises(InvalidTransition, match="not a terminal state"):
        lifecycle.end(row, SessionState.PAUSED)
    assert row.status == "running"


class HeldBroker:
    """The broker client's interface in memory; ``publish_many`` confirms nothing until its publisher is stopped
    (the session stays active while a test steers it)."""

    def declare_queue(self, experiment: str) -> None:
        pass

    def publish_many(self, session_id: str, experiment: str, samples: Sequence[Sample],
                     stop: threading.Event, per_message: int | None = None) -> int:
        stop.wait(30)
        return 0

    def queue_depth(self, experiment: str) -> int:
        return 0

    def purge_queue(self, experiment: str) -> None:
        pass


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SessionService]:
    svc = SessionService(Settings(home=tmp_path / "home"), broker=HeldBroker())
    data = write_dataset(tmp_path / "data", n_per_label=2)
    svc.registry.register(experiment_dict(data, tmp_path / "store", name="sm"))
    yield svc
    svc.stop()


def _status(service: SessionService, sid: str) -> str:
    return service.session(sid).status


def test_the_service_moves_a_session_through_the_table(service: SessionService) -> None:
    sid = service.start_session("sm", rate=1000.0).id
    assert _status(service, sid) == SessionState.RUNNING
    service.pause(sid)
    service.pause(sid)  # asking for the state it is in changes nothing (no transition, no error)
    assert _status(service, sid) == SessionState.PAUSED
    service.resume(sid)
    assert _status(service, sid) == SessionState.RUNNING
    service.cancel(sid)
    row = service.session(sid)
    assert row.status == SessionState.CANCELLED and row.finished_at is not None
    for control in (service.pause, service.resume, service.cancel):
        with pytest.raises(Conflict, match=f"session {sid} is cancelled"):
            control(sid)


def test_an_ended_session_keeps_its_end_whoever_ends_it_later(service: SessionService) -> None:
    sid = service.start_session("sm", rate=1000.0).id
    runner = service._runners[sid]
    service.cancel(sid)
    finished_at = service.session(sid).finished_at
    runner.finish(SessionState.FAILED, "RuntimeError: after the cancel")  # a publisher crashing late
    service.fail_session(sid, "a launcher failing late")
    row = service.session(sid)
    assert (row.status, row.error, row.finished_at) == ("cancelled", None, finished_at)


def test_failing_an_unknown_session_is_not_found(service: SessionService) -> None:
    with pytest.raises(NotFound, match="no session 'nope'"):
        service.fail_session("nope", "a launcher failing")
