"""``labswarm jobs set JOB KEY=VALUE...``: change a running job's training live (issue 25 item 5).

Keys: ``learning_rate`` (a positive number: the schedule's new base rate) and ``patience`` (or
``early_stopping.patience``: a whole number of epochs, for a job with early stopping). Every learner applies the
change at the start of the next epoch (:mod:`labswarm.jobs.service.live`); the job's manifest and its bundle keep
it. Exit status 2 for a bad key or value (named), or a job that refuses it (finished: 409).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from labswarm.cli.exits import USAGE
from labswarm.cli.jobs import DEFAULT_MANAGER, JobId, Manager, TokenFile, _call, _id, console
from labswarm.cli.output import err

#: The keys ``jobs set`` takes: their type, and where they go in the PATCH body's ``training``.
KEYS: dict[str, tuple[type, tuple[str, ...]]] = {
    "learning_rate": (float, ("learning_rate",)), "lr": (float, ("learning_rate",)),
    "patience": (int, ("early_stopping", "patience")),
    "early_stopping.patience": (int, ("early_stopping", "patience")),
}


def parse_changes(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as the PATCH body's ``training``.

    Raises:
        typer.BadParameter: no ``=``, an unknown key (the known ones listed) or a value of the wrong type.
    """
    training: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"{pair!r}: give KEY=VALUE, e.g. learning_rate=0.001")
        if key not in KEYS:
            raise typer.BadParameter(f"{key!r}: not a live setting; the keys: {', '.join(KEYS)}")
        kind, path = KEYS[key]
        try:
            value = kind(text)
        except ValueError:
            raise typer.BadParameter(f"{key}: {text!r} is not {'a number' if kind is float else 'a whole number'}"
                                     ) from None
        target = training
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    return training


def set_command(job: JobId,
                changes: Annotated[list[str], typer.Argument(
                    metavar="KEY=VALUE...", help="learning_rate=0.001, patience=5 (early_stopping.patience).")],
                manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """Change a running job's training: every learner applies it at the start of the next epoch."""
    try:
        training = parse_changes(changes)
    except typer.BadParameter as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(USAGE) from None
    job = _call(manager, token_file, lambda c: _id(c, job))
    event = _call(manager, token_file, lambda c: c.change_training(job, training))
    previous = event.get("previous") or {}
    said = []
    if "learning_rate" in training:
        said.append(f"learning_rate {previous.get('learning_rate')} -> {training['learning_rate']}")
    if "early_stopping" in training:
        said.append(f"patience {(previous.get('early_stopping') or {}).get('patience')} -> "
                    f"{training['early_stopping']['patience']}")
    when = (f"from epoch {event['from_epoch']}" if event.get("from_epoch") is not None
            else "from its first epoch")
    console.print(f"job {job}: {', '.join(said)} {when} (event {event.get('seq')})")
