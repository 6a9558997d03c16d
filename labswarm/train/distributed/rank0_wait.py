"""Peers wait for rank 0 in the job's store, not in a collective, while rank 0 validates alone.

Where the replicas differ (``model_averaging``; a worker group of ``downpour`` or ``distributed_hogwild``), rank 0
validates its own replica alone between two passes and at the end of training (point 5 of
:mod:`labswarm.train.distributed.training`); the peers of its process group (every learner of a synchronous
framework, the members of rank 0's worker group otherwise) go on to their next collective: the all-reduce of "who
has a chunk" of the next pass, or the framework's last sync. Waiting there, a peer failed its step once rank 0's
validation and checkpoint took longer than the collective timeout (``timeout_s``, 30 s), which a loaded machine
or a large validation split reaches, and the healthy job restarted.

Here rank 0 marks in the job's store that it has begun a pass (or finished training): ``<prefix>/begun-<label>``,
``<prefix>`` the attempt's (``labswarm/attempt-<n>``) or its worker group's generation
(``labswarm/attempt-<n>/group-<g>/gen-<k>``, :meth:`LearnerContext.join_group`); each peer waits for that mark
before the collective, so the collective no longer waits on rank 0's validation. The store wait is bounded by
:data:`WAIT_S`, not by the collective timeout: a rank 0 that dies is not waited for that long, since a synchronous
framework's lifecycle kills its peers at once (:mod:`labswarm.jobs.lifecycle.outcomes`), and a worker group's
peer polls its group's generation every :data:`POLL_S` and fails as soon as a restarted member moved the group to
a new one (as it failed at its next collective before).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

#: The longest a peer waits for rank 0's mark, in s (a validation and checkpoint of a large split, loaded).
WAIT_S = 3600.0
#: Seconds between two looks at a worker group's generation while a peer waits.
POLL_S = 5.0


def prefix(learner: Any) -> str | None:
    """The store prefix of this learner's waits for rank 0, ``None`` where it never waits (a shared validation,
    no process group, or a worker group without rank 0); read once, at the first call after the learner joined
    (a worker group's generation is the one it joined). ``learner``: a
    :class:`~labswarm.train.distributed.training.DistributedTraining` after its :meth:`attach`."""
    if not hasattr(learner, "_rank0_prefix"):
        learner._rank0_prefix = _prefix(learner)
    return learner._rank0_prefix


def _prefix(learner: Any) -> str | None:
    if not learner._joined or learner.shared_validation:
        return None
    attempt = f"labswarm/attempt-{learner.context.attempt}"
    if learner.framework.synchronous:
        return attempt
    if learner.rank >= learner.framework.group_size:  # not rank 0's group: nobody of it validates
        return None
    group = f"{attempt}/group-0"
    store = learner.cursor.store
    generation = store.get(f"{group}/gen").decode() if store.check([f"{group}/gen"]) else ""
    return f"{group}/gen-{int(generation) if generation else 0}"


def begun(learner: Any, label: str) -> None:
    """Rank 0 marks that it has begun ``label`` (a pass's number, or ``end``); nothing on other ranks."""
    where = prefix(learner) if learner.rank == 0 else None
    if where is not None:
        learner.cursor.store.set(f"{where}/begun-{label}", "1")


def wait(learner: Any, label: str) -> None:
    """A peer of rank 0 waits until rank 0 has begun ``label``; nothing on rank 0 or where nobody is waited for.

    Raises:
        torch.distributed.DistStoreError: no mark within :data:`WAIT_S`.
        RuntimeError: a restarted member moved this worker group to a new generation meanwhile.
    """
    where = prefix(learner) if learner.rank != 0 else None
    if where is None:
        return
    store, key = learner.cursor.store, f"{where}/begun-{label}"
    group, _, generation = where.rpartition("/gen-")
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            store.wait([key], timedelta(seconds=POLL_S))
            return
        except Exception:  # DistStoreError: not yet
            if not learner.framework.synchronous:
                now = store.get(f"{group}/gen").decode() if store.check([f"{group}/gen"]) else ""
                if (int(now) if now else 0) != int(generation):
                    raise RuntimeError(f"worker group 0 moved to generation {now} while rank {learner.rank} "
                                       f"waited for rank 0 to begin {label}: a member restarted") from None
            if time.monotonic() > deadline:
                raise
