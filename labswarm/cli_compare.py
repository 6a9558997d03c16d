"""``labswarm compare``: the framework comparison (:mod:`labswarm.learners.compare`), without the job service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labswarm.cli_output import console
from labswarm.cli_output import fail as _fail
from labswarm.errors import LabswarmError


def compare_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML with model and training sections.")],
    frameworks: Annotated[str, typer.Option(help="Comma-separated framework names.")] = "allreduce,downpour",
    learners: Annotated[int, typer.Option(min=2, help="Learner processes per framework.")] = 2,
    epochs: Annotated[int | None, typer.Option(min=1, help="Override training.epochs.")] = None,
    target: Annotated[float, typer.Option(min=0.0, max=1.0, help="Validation accuracy to time.")] = 0.8,
    ps_shards: Annotated[int, typer.Option(min=1, help="Parameter-server shards.")] = 1,
    output: Annotated[Path | None, typer.Option(
        help="Output folder; default <LABSWARM_HOME>/compare/<UTC stamp> when that home exists (the dashboard's "
             "/ui/compare lists it), else ./compare.")] = None,
    owner: Annotated[str | None, typer.Option(help="User recorded as the run's owner (may see it on the "
                                                   "dashboard; admins see every run).")] = None,
) -> None:
    """Train the experiment under each framework in turn (local learner processes, same model, data, seed, epochs
    and per-learner batch) and write a table, plots and compare.json into the output folder."""
    from labswarm.learners.compare import compare, default_output, table
    from labswarm.settings import Settings

    if output is None:
        output = default_output(Settings().home)
    names = [n.strip() for n in frameworks.split(",") if n.strip()]
    try:
        rows = compare(experiment, names, output, learners=learners, epochs=epochs, target=target,
                       ps_shards=ps_shards, owner=owner)
    except LabswarmError as exc:
        raise _fail(exc) from None
    console.print(table(rows), highlight=False, markup=False)
    console.print(f"figures, plots and compare.json in {output}")
