"""A learner of ``tests/train/test_rank0_wait.py``: the trainer in distributed mode under ``FRAMEWORK_JSON``, whose
rank 0 sleeps ``SLEEP_S`` after each epoch's validation and checkpoint (a validation slower than the collective
timeout), its place in the job from the environment.

``python slow_validation_worker.py EXPERIMENT HOME FRAMEWORK_JSON SLEEP_S``; exits 0 when the training completed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

from labswarm.config.experiment import load_experiment
from labswarm.train.distributed.training import DistributedTraining
from labswarm.train.trainer import Trainer, TrainerHooks


class SlowAfterEpoch(TrainerHooks):
    """Sleeps ``seconds`` after each epoch (after rank 0's validation and checkpoint)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def after_epoch(self, trainer: Any, record: dict[str, Any]) -> None:
        time.sleep(self.seconds)


def main() -> int:
    experiment, home, framework, sleep_s = sys.argv[1:5]
    torch.set_num_threads(1)
    hooks = [SlowAfterEpoch(float(sleep_s))] if os.environ["RANK"] == "0" else []
    trainer = Trainer(load_experiment(experiment), home, hooks=hooks,
                      distributed=DistributedTraining(json.loads(framework)))
    trainer.fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
