"""The members of a process group agree on the checkpoint they resume from (issue 23).

The learners of a lockstep process group (a synchronous framework's, or one worker group's) must resume at one
position: the same pass and step, else they take different numbers of steps and meet in different collectives
(a member one pass behind claims in a pass that is done, joins its peers' steps as a filler, ends the training a
pass early and waits in its last collective while they still step). Each restores its own newest copy, and in a
job those can differ: a worker group restarts alone, each member from the newest copy of its own the results
store holds (:func:`labswarm.jobs.spec.layout.latest_rank_copy`), and a member that died before its newest copy was
stored comes back with an older one than its peers.

:func:`agree_on_resume` makes them one: the members gather their positions (epochs done, step of the next epoch);
when they differ, every member takes the newest (ties: the lowest group rank's) whole checkpoint, sent to it in the
group (one ``broadcast_object_list``). The members of a lockstep group hold one replica (the same parameters and
optimizer state after every step), so the newest member's state is the group's; nothing the group trained is
lost, and the global cursor (in the job's store, not in the checkpoint) knows which chunks are done. The running
sums of the resumed epoch are then that member's (its figures continue them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def position(state: Mapping[str, Any] | None) -> tuple[int, int]:
    """Where a checkpoint resumes: ``(epochs done, steps of the next epoch)``; an epoch's end is step -1, no
    checkpoint (a fresh start) ``(-1, -1)``."""
    if state is None:
        return -1, -1
    partial = state.get("partial")
    return int(state["epoch"]), -1 if partial is None else int(partial["steps"])


def agree_on_resume(state: dict[str, Any] | None, rank: int) -> dict[str, Any] | None:
    """The checkpoint this member resumes from once its group agreed: ``state`` (its own, ``None`` when it has
    none) when every member's position is the same, else the newest member's (module docstring). Collective in the
    process group this process has joined (its default group): every member calls it, before training.

    Args:
        state: this member's checkpoint as :func:`labswarm.train.checkpoint.load` reads it, or ``None``.
        rank: this learner's rank in the job (for the log line only).

    Raises:
        torch.distributed.DistError: a member failed or did not call it within the collective timeout.
    """
    import torch
    import torch.distributed as dist

    mine = position(state)
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor(mine, dtype=torch.int64))
    positions = [(int(t[0]), int(t[1])) for t in gathered]
    newest = max(positions)
    if all(p == newest for p in positions):
        return state
    source = positions.index(newest)
    box = [state if dist.get_rank() == source else None]
    dist.broadcast_object_list(box, src=source)
    if mine == newest:
        return state
    log.warning("rank %d: its checkpoint is at %s, its group's newest at %s: it takes rank %d's checkpoint "
                "(group rank %d)", rank, mine, newest, rank - dist.get_rank() + source, source)
    return box[0]
