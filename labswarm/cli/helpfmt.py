"""How the command line's help reads: one style for every command, whatever its source text.

* **No hard line breaks**: a docstring's paragraphs are wrapped at 120 columns in the source; the help reflows
  each paragraph to the terminal (a paragraph whose lines start with ``-``, ``*`` or spaces, or one marked
  ``\\b``, click's "keep as written", is kept as written). Typer reflows a command's first paragraph only, and
  nothing in the command lists.
* **One placeholder style**: every positional argument is shown in capitals, ``{EXPERIMENT}``, ``{JOB}``,
  ``{MODEL_OR_JOB}``, ``{AUDIO...}`` (the style of the usage lines in the docs and man pages); an explicit metavar
  is kept.

:class:`HelpGroup` applies both to the whole command tree once it is built (the root's ``cls``).
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperGroup


class HelpGroup(TyperGroup):
    """The root command group: on creation, its commands and sub-groups, recursively, get reflowed help texts and
    capital placeholders (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tidy(self)


def tidy(command: Any) -> None:
    """Reflow ``command``'s help and its parameters', and capitalize its arguments' placeholders; the same for
    every sub-command of a group. ``command``: a click command of typer's (typer carries its own click, so the
    parts are told apart by what they have, not by their class)."""
    if command.help:
        command.help = reflow(command.help)
    if command.short_help:
        command.short_help = reflow(command.short_help)
    for param in command.params:
        if param.param_type_name == "argument" and param.metavar is None and param.name:
            param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")  # typer's "..." needs no metavar
        if isinstance(help_text := getattr(param, "help", None), str):
            param.help = reflow(help_text)
    if isinstance(commands := getattr(command, "commands", None), dict):
        for sub in commands.values():
            tidy(sub)


def reflow(text: str) -> str:
    """``text`` (a docstring: indented, wrapped) with each paragraph on one line; paragraphs stay apart by a blank
    line; a list, an indented block or a ``\\b`` paragraph is kept as written."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if _kept(p) else " ".join(p.split()) for p in paragraphs)


def _kept(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    return paragraph.startswith("\b") or any(line.startswith(("-", "*", " ", "\t")) for line in lines[1:]) or (
        len(lines) > 1 and lines[0].lstrip().startswith(("-", "*")))
