"""A learner of ``tests/train/test_distributed_async_halt.py``: the trainer in distributed mode (downpour), its place
in the job from the environment, with a hook that plays one side of a halt between two passes.

``python async_halt_worker.py EXPERIMENT HOME ROLE fresh|resume``; exits 3 when the training stopped (a halt with a
mid-epoch checkpoint), 0 when it completed. Roles:

- ``boundary``: asks to stop once its first epoch has ended (a halt that arrives during its validation), and says so
  in the job's store (``test/halting``);
- ``late``: in the second pass, after its first step, waits until the ``boundary`` learner has asked to stop, then
  trains 2 more steps and asks to stop: chunks of that pass marked done after the other learner stopped;
- ``none``: never asks.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import torch

from labswarm.config.experiment import load_experiment
from labswarm.train.distributed.training import DistributedTraining
from labswarm.train.trainer import Trainer, TrainerHooks

HALTING = "test/halting"


class Role(TrainerHooks):
    """One side of the halt (see the module docstring)."""

    def __init__(self, role: str) -> None:
        self.role, self.epochs, self.late_steps = role, 0, 0

    def after_epoch(self, trainer: Any, record: dict[str, Any]) -> None:
        self.epochs += 1

    def after_step(self, trainer: Any, epoch: int, step: int, loss: float) -> None:
        if self.role == "late" and epoch == 1:
            self.late_steps += 1
            if self.late_steps == 1:
                trainer.distributed.cursor.store.wait([HALTING], timedelta(seconds=120))

    def should_stop(self, trainer: Any) -> bool:
        if self.role == "boundary" and self.epochs >= 1:
            trainer.distributed.cursor.store.set(HALTING, "1")
            return True
        return self.role == "late" and self.late_steps >= 3


def main() -> int:
    experiment, home, role, mode = sys.argv[1:5]
    torch.set_num_threads(1)
    trainer = Trainer(load_experiment(experiment), home, hooks=[Role(role)],
                      distributed=DistributedTraining({"name": "downpour"}))
    return 3 if trainer.fit(resume=mode == "resume").stopped else 0


if __name__ == "__main__":
    sys.exit(main())
