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

Exit codes: 0 trained, 2 a labswarm error (the experiment, the framework or the data; printed) or a usage error, 1
any other error (its traceback printed). Once the outcome is known and the output flushed, the process ends
without the interpreter's teardown (``os._exit``, as a job's learner does): gloo's threads and torch's
destructors there once aborted a learner under load ("terminate called without an active exception", -6: a C++
thread of the process group still joinable at its destruction), which turned a trained run into a failed one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

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


def _json_object(text: str) -> dict[str, Any]:
    """``--framework``'s value: a JSON object.

    Raises:
        argparse.ArgumentTypeError: not JSON, or not an object (argparse exits with 2, naming the option).
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'not a JSON object ({{"name": ...}}): {text}')
    return value


def main(argv: list[str] | None = None) -> int:
    """Run one learner; 0 on success, 2 on a labswarm error (printed)."""
    parser = argparse.ArgumentParser(prog="python -m labswarm.train.distributed.learner")
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--home", type=Path, required=True, help="labswarm home of this run")
    parser.add_argument("--framework", required=True, type=_json_object,
                        help='the framework spec as JSON: {"name": ...}')
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
        Trainer(config, args.home, distributed=DistributedTraining(args.framework)).fit(
            resume=args.resume)
    except LabswarmError as exc:
        print(f"learner failed: {exc}", file=sys.stderr)
        return 2
    return 0


def run(argv: list[str] | None = None) -> NoReturn:
    """:func:`main`, then end the process with its exit code (module docstring): 2 for a usage error, 1 with the
    traceback printed for an error other than labswarm's, 130 for Ctrl-C; a ``sys.exit("text")`` prints its text
    and ends with 1, as the interpreter would; standard output and error flushed first, no interpreter teardown."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help (0), a usage error (2, its message printed); sys.exit("text")
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # what the interpreter prints for a non-integer exit code
    except KeyboardInterrupt:
        code = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C
    except BaseException:  # the process ends here: print what the interpreter would
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
