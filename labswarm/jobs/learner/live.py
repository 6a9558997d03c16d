"""Live changes in a learner (issue 25 item 5): the job's training changed through ``PATCH /v1/jobs/{id}``
(:mod:`labswarm.jobs.service.live`) is applied by every learner at the start of the epoch the change names
(``from_epoch``, the epoch after the one the learners were in when it was asked), or at the next epoch start when
it arrives later (``late`` in its event).

At each epoch start the learner sends its report at once (one round trip), so it holds the manager's latest change
there; the report's answer carries it (:class:`~labswarm.jobs.learner.reporter.JobReporter` keeps ``change``). Each
learner reports a ``change`` event with what its optimizer holds once applied (read back, not the value asked for).
Learners in lockstep (synchronous frameworks) take rank 0's decision, broadcast at each epoch start, so they all
apply it in the same epoch.
A learner of a later attempt applies the latest change again (its checkpoint may predate it).
"""

from __future__ import annotations

import logging
from typing import Any

from labswarm.jobs.learner.context import LearnerContext
from labswarm.train.live import set_learning_rate, set_patience

log = logging.getLogger("labswarm.learner")


class LiveChanges:
    """The changes one learner has applied (by the manager's change sequence number)."""

    def __init__(self, learner: LearnerContext) -> None:
        self.learner = learner
        self.applied = 0  # the sequence number of the last change applied

    def before_epoch(self, trainer: Any, epoch: int, optimizer: Any, schedule: Any) -> None:
        """Apply the manager's latest change if it is new and due (see the module docstring). Learners that step
        in lockstep apply what rank 0 (a worker group: its first rank) decided, broadcast to them: all at one epoch."""
        loop = trainer.loop  # a single learner's too (its producers' hooks, labswarm.jobs.learner.entry)
        if loop.several and loop.lockstep and loop.context.world_size > 1:
            import torch.distributed as dist

            box = [self._due(epoch) if dist.get_rank() == 0 else None]  # rank 0, or a worker group's first
            dist.broadcast_object_list(box, src=0)
            change = box[0]
        else:
            change = self._due(epoch)
        if change is None:
            return
        due = change.get("from_epoch")
        payload: dict[str, Any] = {"seq": change["seq"], "epoch": epoch + 1, "from_epoch": due,
                                   "late": due is not None and epoch + 1 > int(due), "rank": self.learner.spec.rank}
        if change.get("learning_rate") is not None:
            payload["learning_rate"] = set_learning_rate(optimizer, schedule, float(change["learning_rate"]))
        if change.get("patience") is not None and trainer.watch.stops:
            payload["patience"] = set_patience(trainer.watch, int(change["patience"]))
        self.applied = int(change["seq"])
        log.info("live change %s applied at the start of epoch %d: %s", change["seq"], epoch + 1,
                 {k: v for k, v in payload.items() if k in ("learning_rate", "patience")})
        self.learner.reporter.event("change", payload)

    def _due(self, epoch: int) -> dict[str, Any] | None:
        """The manager's latest change if this learner has not applied it and epoch ``epoch`` (from 0) is due."""
        reporter = self.learner.reporter
        reporter.flush()  # the latest change, now
        change = reporter.change
        if not change or int(change["seq"]) <= self.applied:
            return None
        due = change.get("from_epoch")
        if due is not None and epoch + 1 < int(due):
            return None
        return dict(change)
