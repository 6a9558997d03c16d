"""One learner of a distributed run: ``python -m labswarm.train.distributed.learner EXPERIMENT.yml --home DIR
--framework JSON``.

Its place in the job comes from the environment (:class:`~labswarm.train.distributed.context.LearnerContext`: ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LABSWARM_ATTEMPT``, ``LABSWARM_PS_ADDRS``, ...), as
:func:`~labswarm.train.distributed.launch.plan_attempt` gives it. It trains the experiment's model with the one
trainer in distributed mode (:mod:`labswarm.train.distributed.training`); rank ``r`` writes its metrics to
``<home>/train/<experiment>-<fingerprint>/rank-<r>/metrics.jsonl``, rank 0 the model file; ``--resume`` continues
from the rank's checkpoint (a halted epoch where it stopped, with the coordinator given rank 0's cursor). A local
runner without the job service (``tests/train/test_distributed.py``); a job's learners
(:mod:`labswarm.jobs.learner.entry`) run the same trainer in the same mode.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from labswarm.config.experiment import ExperimentConfig, load_experiment, parse_experiment
from labswarm.errors import LabswarmError


def with_epochs(config: ExperimentConfig, epochs: int | None) -> ExperimentConfig:
    """The experiment with ``training.epochs`` replaced (``None``: unchanged).

    Raises:
        ConfigError: the experiment has no ``training`` section, or ``epochs`` is out of range.
    """
    if epochs is None:
        return config
    data: dict[str, Any] = config.model_dump(mode="json")
    data["training"] = {**(data.get("training") or {}), "epochs": epochs}
    return parse_experiment(data)


def main(argv: list[str] | None = None) -> int:
    """Run one learner; 0 on success, 2 on a labswarm error (printed)."""
    parser = argparse.ArgumentParser(prog="python -m labswarm.train.distributed.learner")
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--home", type=Path, required=True, help="labswarm home of this run")
    parser.add_argument("--framework", required=True, help='the framework spec as JSON: {"name": ...}')
    parser.add_argument("--epochs", type=int, help="override training.epochs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this learner (default 1)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from this rank's checkpoint (a halted epoch goes on where it stopped)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from labswarm.train.distributed.training import DistributedTraining
    from labswarm.train.trainer import Trainer

    try:
        config = with_epochs(load_experiment(args.experiment), args.epochs)
        import torch

        torch.set_num_threads(args.threads)
        Trainer(config, args.home, distributed=DistributedTraining(json.loads(args.framework))).fit(
            resume=args.resume)
    except LabswarmError as exc:
        print(f"learner failed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
