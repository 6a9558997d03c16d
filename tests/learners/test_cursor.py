"""The global cursor: exclusive chunks, leases, a killed learner, a restarted coordinator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore

from labswarm.errors import ConfigError
from labswarm.train.distributed.cursor import CursorError, GlobalCursor
from learners.tiny import kill_all, logs, wait_all, wait_for

WORKER = Path(__file__).with_name("cursor_worker.py")


def trained(out: Path) -> list[dict[str, Any]]:
    """Every chunk the learners recorded as trained."""
    return [json.loads(line) for f in sorted(out.glob("rank-*.jsonl")) for line in f.read_text().splitlines()]


@pytest.mark.slow
def test_a_killed_learners_chunk_goes_back_and_every_sample_is_trained_once_per_pass(
        store: Any, master_env: dict[str, str], tmp_path: Path) -> None:
    n_samples, chunk, passes = 203, 10, 2
    spec = {"n_samples": n_samples, "chunk_size": chunk, "lease_s": 1.0, "passes": passes, "out": str(tmp_path),
            "hold": {"0": 1}}
    procs = {}
    try:
        env = {**os.environ, **master_env}
        for rank in range(3):  # rank 0 first: it trains one chunk, claims a second and hangs on it
            with open(tmp_path / f"learner-{rank}.log", "ab") as log:
                procs[rank] = subprocess.Popen(
                    [sys.executable, str(WORKER), json.dumps({**spec, "wait_go": rank > 0})],
                    stdout=log, stderr=subprocess.STDOUT, env={**env, "RANK": str(rank)})
        held = wait_for(lambda: store.check(["holding"]) and store.get("holding").decode(), 60, "rank 0 to hold")
        procs[0].send_signal(signal.SIGKILL)  # mid-pass, holding a lease
        assert procs[0].wait(timeout=10) == -signal.SIGKILL
        store.set("go", "1")
        wait_all({r: procs[r] for r in (1, 2)}, 60, tmp_path)
    finally:
        kill_all(procs.values())
    records = trained(tmp_path)
    for pass_ in range(passes):
        counts = Counter(s for r in records if r["pass"] == pass_ for s in r["samples"])
        assert sorted(counts) == list(range(n_samples)), f"pass {pass_}: samples missing"
        assert set(counts.values()) == {1}, f"pass {pass_}: samples trained twice"
    pass_, index = map(int, held.split("/"))
    retaken = [r for r in records if (r["pass"], r["chunk"]) == (pass_, index)]
    assert len(retaken) == 1 and retaken[0] in trained_by(tmp_path, {1, 2})  # the survivors trained it
    cursor = GlobalCursor(store, n_samples, chunk, owner="coordinator")
    assert all(v.startswith("D|") for p in range(passes) for v in cursor.chunk_states(p)), logs(tmp_path)


def trained_by(out: Path, ranks: set[int]) -> list[dict[str, Any]]:
    return [json.loads(line) for r in ranks for line in (out / f"rank-{r}.jsonl").read_text().splitlines()]


def test_state_survives_a_coordinator_restart(store: Any) -> None:
    a = GlobalCursor(store, 25, 4, owner="a", lease_s=30)
    b = GlobalCursor(store, 25, 4, owner="b", lease_s=30)
    first = [a.claim(0), b.claim(0), a.claim(0)]
    assert len({c.index for c in first}) == 3
    assert a.done(first[0]) and b.done(first[1])  # first[2] stays leased by a live learner
    state = a.state_dict()
    assert len(state["passes"][0]) == 7 and sum(v.startswith("D|") for v in state["passes"][0]) == 2
    restarted = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    fresh = GlobalCursor(restarted, 25, 4, owner="coordinator")
    fresh.load_state_dict(json.loads(json.dumps(state)))  # as a JSON checkpoint would give it back (str keys)
    a2, b2 = (GlobalCursor(restarted, 25, 4, owner=o, lease_s=30) for o in "ab")
    assert a2.done(first[2])  # the live lease survived the restart
    seen = [s for c in first for s in c.samples]
    while (c := b2.claim(0, timeout_s=5)) is not None:
        assert b2.done(c)
        seen.extend(c.samples)
    assert sorted(seen) == list(range(25))
    assert all(v.startswith("D|") for v in GlobalCursor(restarted, 25, 4, owner="x").state_dict()["passes"][0])


def test_lease_renewal_and_a_lost_lease(store: Any) -> None:
    a = GlobalCursor(store, 2, 1, owner="a", lease_s=0.05)
    b = GlobalCursor(store, 2, 1, owner="b", lease_s=30)
    c0, c1 = a.claim(0), b.claim(0)
    renewed = b.renew(c1)
    assert renewed is not None and renewed.lease != c1.lease
    assert b.renew(c1) is None  # the old lease value is gone
    wait_for(lambda: float(c0.lease.rsplit("|", 1)[1]) < time.time(), 5, "a's lease to expire")
    taken = b.claim(0, timeout_s=5)
    assert taken.index == c0.index and not a.done(c0)  # taken over: a's work does not count
    assert a.renew(c0) is None
    assert b.done(taken)
    with pytest.raises(CursorError, match="no chunk came free"):
        a.claim(0, timeout_s=0.1)  # the other chunk is held by b's live lease
    assert b.done(renewed) and a.claim(0) is None  # every chunk done: the pass is complete


def test_a_released_chunk_is_claimed_again_in_lockstep(store: Any) -> None:
    """A halt gives back chunks claimed but not trained: free in the state, and claim_fresh hands them out again
    although the fetch-and-add counter is past them; a lost lease cannot be released."""
    a = GlobalCursor(store, 10, 2, owner="a", lease_s=30)
    b = GlobalCursor(store, 10, 2, owner="b", lease_s=30)
    first = [a.claim_fresh(0), b.claim_fresh(0)]
    assert a.done(first[0]) and b.release(first[1])
    assert not b.release(first[1]) and not b.done(first[1])  # its lease is gone with the release
    assert a.state_dict()["passes"][0][first[1].index] == ""  # free in the checkpoint
    seen = list(first[0].samples)
    while (c := (b if len(seen) % 4 else a).claim_fresh(0)) is not None:
        assert (b if c.lease.startswith("L|b") else a).done(c)
        seen.extend(c.samples)
    assert sorted(seen) == list(range(10))  # the released chunk trained once, by whoever claimed it


def test_bad_layout_names_the_field(store: Any) -> None:
    with pytest.raises(ConfigError, match=r"cursor\.chunk_size"):
        GlobalCursor(store, 10, 0, owner="a")
    with pytest.raises(ConfigError, match=r"cursor\.seed"):
        GlobalCursor(store, 10, 2, owner="a", seed=1).load_state_dict(
            {"n_samples": 10, "chunk_size": 2, "seed": 0, "passes": {}})


def test_a_failed_store_is_a_cursor_error() -> None:
    """The coordinator's store gone (its process died): every cursor call raises CursorError, as documented
    (was: torch's DistNetworkError from the fetch-and-add, get and check calls)."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
    cursor = GlobalCursor(client, n_samples=10, chunk_size=2, owner="r0")
    chunk = cursor.claim(0, timeout_s=5)
    assert chunk is not None and cursor.done(chunk)
    del server
    for call in (lambda: cursor.claim(0, timeout_s=1), lambda: cursor.claim_fresh(1), cursor.state_dict,
                 lambda: cursor.load_state_dict({"n_samples": 10, "chunk_size": 2, "seed": 0,
                                                 "passes": {0: ["D|r0"]}})):
        with pytest.raises(CursorError, match="the cursor's store failed"):
            call()
