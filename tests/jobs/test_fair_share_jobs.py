"""Fair share between users on a real manager (uvicorn, SQLite, ``command`` learners as real processes) with one
learner slot: alice submits three jobs, then bob three, behind a job that holds the slot; the slot then goes to
bob's first job second (a global FIFO gave him the fourth start), and the queue positions shown at submission
alternate between them."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.auth.tokens import add_token

#: A learner that runs until the file ``argv[1]`` exists (``-`` : about a second).
_PROGRAM = """
import os, sys, time
print("started", flush=True)
deadline = time.monotonic() + 1.0
while (not os.path.exists(sys.argv[1])) if sys.argv[1] != "-" else time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _manifest(tmp_path: Path, name: str, release: str = "-") -> dict:
    return tiny_manifest(tmp_path, name=name, framework={
        "name": "command", "command": [sys.executable, "-c", _PROGRAM, release]})


@pytest.mark.slow
def test_two_users_on_one_slot_take_turns_instead_of_first_come_first_served(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    # admins: a user may not submit a `command` job; the fair share counts owners, whatever their role
    keys = {name: add_token(tokens, name, "admin") for name in ("root", "alice", "bob")}
    with manager(tmp_path, tokens_file=tokens, job_slots=1) as m:
        clients = {name: httpx.Client(base_url=m.server.url, headers={"Authorization": f"Bearer {key}"},
                                      timeout=30) for name, key in keys.items()}
        try:
            gate = clients["root"].post("/v1/jobs", json=_manifest(tmp_path, "gate", str(tmp_path / "open")))
            assert gate.status_code == 201, gate.text
            read_events(clients["root"], gate.json()["id"],
                        until=lambda e: e["event"] == "log" and "started" in e["data"]["line"])
            submitted = []
            for name in ("alice", "alice", "alice", "bob", "bob", "bob"):
                answer = clients[name].post("/v1/jobs", json=_manifest(tmp_path, f"{name}{len(submitted)}"))
                assert answer.status_code == 201, answer.text
                submitted.append((name, answer.json()["id"]))
            positions = {job_id: clients["root"].get(f"/v1/jobs/{job_id}").json()["queue_position"]
                         for _, job_id in submitted}
            (tmp_path / "open").touch()
            for _, job_id in submitted:
                assert statuses(read_events(clients["root"], job_id))[-1] == "completed"
            shown = [clients["root"].get(f"/v1/jobs/{job_id}").json() for _, job_id in submitted]
        finally:
            for client in clients.values():
                client.close()
    owners = [job["owner"] for job in sorted(shown, key=lambda job: job["timestamps"]["pending"])]
    # FIFO: alice, alice, alice, bob, bob, bob. After alice's first job she has used slot time and bob none: his
    # first job is next whatever the machine's speed (what follows depends on how long each job took: exact
    # alternation on equal durations is tests/jobs/test_fair_share_order.py's)
    assert owners[:2] == ["alice", "bob"], owners
    # the queue positions shown follow the same rule: bob's first job was second in line
    assert [positions[job_id] for _, job_id in submitted] == [1, 3, 5, 2, 4, 6]
