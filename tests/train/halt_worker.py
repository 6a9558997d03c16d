"""A learner of ``tests/train/test_distributed_halt.py``: the trainer in distributed mode (allreduce), its place in
the job from the environment, asked to stop by a hook once it has trained ``STOP_AFTER`` steps (0: never).

``python halt_worker.py EXPERIMENT HOME STOP_AFTER fresh|resume``; exits 3 when the training stopped (a halt with
a mid-epoch checkpoint), 0 when it completed.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from labswarm.config.experiment import load_experiment
from labswarm.train.distributed.training import DistributedTraining
from labswarm.train.trainer import Trainer, TrainerHooks


class StopAfter(TrainerHooks):
    """Asks to stop once this learner has trained ``steps`` steps (0: never)."""

    def __init__(self, steps: int) -> None:
        self.steps, self.trained = steps, 0

    def after_step(self, trainer: Any, epoch: int, step: int, loss: float) -> None:
        self.trained += 1

    def should_stop(self, trainer: Any) -> bool:
        return 0 < self.steps <= self.trained


def main() -> int:
    experiment, home, stop_after, mode = sys.argv[1:5]
    torch.set_num_threads(1)
    trainer = Trainer(load_experiment(experiment), home, hooks=[StopAfter(int(stop_after))],
                      distributed=DistributedTraining({"name": "allreduce"}))
    return 3 if trainer.fit(resume=mode == "resume").stopped else 0


if __name__ == "__main__":
    sys.exit(main())
