"""A learner of ``tests/train/test_group_resume.py``: the trainer in distributed mode under worker groups of 2, its
place in the job from the environment.

``python group_halt_worker.py EXPERIMENT HOME FRAMEWORK_JSON fresh|resume``; exits 3 when the training stopped (a
halt with a mid-epoch checkpoint), 0 when it completed. Fresh, it asks to stop in its second pass once it has
trained a step of it (a group that gets no chunk of that pass completes the training).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from labswarm.config.experiment import load_experiment
from labswarm.train.distributed.training import DistributedTraining
from labswarm.train.trainer import Trainer, TrainerHooks


class HaltInSecondPass(TrainerHooks):
    """Asks to stop after a step of the second pass."""

    def __init__(self) -> None:
        self.epochs, self.steps = 0, 0

    def after_epoch(self, trainer: Any, record: dict[str, Any]) -> None:
        self.epochs, self.steps = self.epochs + 1, 0

    def after_step(self, trainer: Any, epoch: int, step: int, loss: float) -> None:
        self.steps += 1

    def should_stop(self, trainer: Any) -> bool:
        return self.epochs == 1 and self.steps >= 1


def main() -> int:
    experiment, home, framework, mode = sys.argv[1:5]
    torch.set_num_threads(1)
    fresh = mode == "fresh"
    trainer = Trainer(load_experiment(experiment), home, hooks=[HaltInSecondPass()] if fresh else [],
                      distributed=DistributedTraining(json.loads(framework)))
    return 3 if trainer.fit(resume=not fresh).stopped else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown (as tests/learners/worker.py and the job's learner entry): a halted group member was
    # seen spinning in the garbage collector there for minutes, its worker group's process group still alive
    os._exit(code)
