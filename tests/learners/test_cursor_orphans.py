"""``GlobalCursor.claim_orphan`` (issue 23 item 3): once the fresh chunks are out, a worker group's learner takes
over, without waiting, an expired lease or one its own dead predecessor (same rank, another process) holds, never a
live lease of another learner."""

from __future__ import annotations

import time
from typing import Any

from labswarm.train.distributed.cursor import PREFIX, GlobalCursor


def test_a_restarted_learner_takes_its_predecessors_and_expired_chunks_never_a_live_peers(store: Any) -> None:
    dead = GlobalCursor(store, 8, 2, owner="3:1:100", lease_s=30)  # rank 3's process, killed holding a chunk
    peer = GlobalCursor(store, 8, 2, owner="1:1:200", lease_s=30)  # rank 1, alive and training
    stale = GlobalCursor(store, 8, 2, owner="2:1:300", lease_s=30)  # rank 2's process, its lease run out below
    held = {"dead": dead.claim_fresh(0), "peer": peer.claim_fresh(0), "stale": stale.claim_fresh(0)}
    heir = GlobalCursor(store, 8, 2, owner="3:1:400", lease_s=30)  # rank 3 restarted
    last = heir.claim_fresh(0)
    assert last is not None and heir.done(last) and heir.claim_fresh(0) is None  # the fresh chunks are out
    expired = held["stale"].lease.rsplit("|", 1)[0] + f"|{time.time() - 1:.3f}"  # its deadline a second ago
    store.compare_set(f"{PREFIX}/0/{held['stale'].index}", held["stale"].lease, expired)
    assert stale.chunk_states(0)[held["stale"].index] == expired
    taken = [heir.claim_orphan(0, "3:"), heir.claim_orphan(0, "3:")]
    assert sorted(c.index for c in taken) == sorted((held["dead"].index, held["stale"].index))
    assert heir.claim_orphan(0, "3:") is None  # rank 1's live lease is not taken: never waited for either
    assert all(heir.done(c) for c in taken) and peer.done(held["peer"])
    assert not dead.done(held["dead"]) and not stale.done(held["stale"])  # their work does not count
    assert all(v.startswith("D|") for v in heir.chunk_states(0))  # every chunk of the pass done, once
