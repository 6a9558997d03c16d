"""Generate the command-line reference (mkdocs-gen-files) from the typer app, at build time.

The app is the ``labswarm`` console script that pyproject.toml declares (``[project.scripts]``), so a move of the
CLI's modules needs no change here. ``typer.main.get_command`` turns it into its click command tree; every
command, group and parameter is listed with the help text, defaults and bounds that ``labswarm ... --help``
shows (each parameter's own help record). Nothing is written by hand.
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path

import mkdocs_gen_files
import typer.main

from labswarm.cli.exits import MEANINGS

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, cell, paragraphs

SCRIPT = "labswarm"
#: typer's shell-completion options, the same on every typer app.
SKIP_PARAMS = {"install_completion", "show_completion"}


def load_app() -> typer.Typer:
    """The typer app behind the ``labswarm`` console script of pyproject.toml."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts[SCRIPT].partition(":")
    return getattr(importlib.import_module(module), attr)


def render(command, name: str, parent, out: list[str], depth: int) -> None:
    ctx = command.context_class(command, info_name=name, parent=parent)
    if getattr(command, "hidden", False):
        return
    subcommands = command.list_commands(ctx) if hasattr(command, "list_commands") else []
    out.append(f"{'#' * min(depth + 1, 6)} `{ctx.command_path}`\n")
    out.append(f"```text\n{ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}\n```\n")
    if command.help:
        out.append(paragraphs(command.help) + "\n")
    params = [p for p in command.params if p.name not in SKIP_PARAMS and not getattr(p, "hidden", False)]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name != "argument"]
    for title, group in (("Arguments", arguments), ("Options", options)):
        if not group:
            continue
        out.append(f"**{title}**\n\n| name | description |\n|---|---|")
        for param in group:
            record = param.get_help_record(ctx) or (param.name, "")
            out.append(f"| `{record[0]}` | {cell(record[1])} |")
        out.append("")
    if subcommands:
        out.append("**Commands**\n\n| command | what |\n|---|---|")
        for sub in subcommands:
            cmd = command.get_command(ctx, sub)
            if cmd is None or getattr(cmd, "hidden", False):
                continue
            short = cmd.get_short_help_str(limit=120) if hasattr(cmd, "get_short_help_str") else (cmd.help or "")
            out.append(f"| [`{sub}`](#{anchor(ctx.command_path + ' ' + sub)}) | {cell(short)} |")
        out.append("")
        for sub in subcommands:
            cmd = command.get_command(ctx, sub)
            if cmd is not None:
                render(cmd, sub, ctx, out, depth + 1)


def anchor(command_path: str) -> str:
    """The id that Markdown's toc extension gives the heading ``command_path`` in backticks."""
    return "-".join(command_path.lower().split())


def main() -> None:
    command = typer.main.get_command(load_app())
    out = [
        "# Command line\n",
        "Generated at build time from the typer app of the `labswarm` console script "
        "(`docs/scripts/gen_cli.py`): what `labswarm COMMAND --help` prints. Guides: "
        "[getting started](../getting-started.md), [sessions](../guides/sessions.md), "
        "[training jobs](../guides/jobs.md).\n",
    ]
    out.append("## Exit status\n\nThe same in every command (`labswarm.cli.exits.MEANINGS`):\n\n| status | meaning |\n"
               "|---|---|")
    out += [f"| {code} | {cell(meaning)} |" for code, meaning in MEANINGS]  # issue 29
    out.append("")
    render(command, SCRIPT, None, out, 1)
    with mkdocs_gen_files.open("reference/cli.md", "w") as f:
        f.write("\n".join(out) + "\n")
    mkdocs_gen_files.set_edit_path("reference/cli.md", "docs/scripts/gen_cli.py")


main()
