"""``labswarm models list``: the models this installation can train (the built-ins and those of installed
packages' ``labswarm.models`` entry points), each with the package it comes from, its input and its parameters."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from labswarm.cli.output import console
from labswarm.cli.output import fail as _fail
from labswarm.errors import LabswarmError

models_app = typer.Typer(help="The models this installation can train.", no_args_is_help=True)


@models_app.command("list")
def list_models(as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False) -> None:
    """Installed models: name, source package, the feature they read by default, parameters and defaults."""
    from labswarm.train.models.catalog import installed_models

    try:
        models = installed_models()
    except LabswarmError as exc:  # a plugin that fails to load: named
        raise _fail(exc) from None
    if as_json:
        print(json.dumps([dataclasses.asdict(m) for m in models], indent=2, default=str))
        return
    table = Table("model", "source", "input", "parameters", title="models")
    for model in models:
        params = "\n".join(
            f"{p.name}: {p.type}" + (" (required)" if p.required else f" = {p.default!r}")
            + (f"  [{p.constraints}]" if p.constraints else "") for p in model.parameters)
        table.add_row(model.name, model.source, model.input or "(required)", escape(params) or "-")
    console.print(table)
