"""``labswarm tokens add | list``: the named API tokens of a tokens file (``LABSWARM_TOKENS_FILE``), hashed at
rest. ``add`` prints the new token once, on stdout alone (``TOKEN=$(labswarm tokens add alice)``), and stores only
its SHA-256; the manager reads the file when it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labswarm.cli.output import console, err
from labswarm.cli.output import fail as _fail
from labswarm.errors import LabswarmError

tokens_app = typer.Typer(help="Named API tokens (users) of the manager, hashed at rest.", no_args_is_help=True)

TokensFile = Annotated[Path | None, typer.Option(
    "--file", dir_okay=False, help="The tokens file, .yaml or .toml (default: LABSWARM_TOKENS_FILE).")]


def _file(path: Path | None) -> Path:
    from labswarm.settings import load_settings

    found = path or load_settings().tokens_file
    if found is None:
        err.print("[bold red]error:[/] no tokens file: give --file or set LABSWARM_TOKENS_FILE")
        raise typer.Exit(2)
    return found


@tokens_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The user's name (letters, digits, '.', '_', '-').")],
    role: Annotated[str, typer.Option(help="admin (everything) or user (their own experiments and jobs).")] = "user",
    file: TokensFile = None,
) -> None:
    """Generate a token for a new user, store its hash, and print the token once (it is not kept anywhere)."""
    from labswarm.auth.tokens import add_token

    path = _file(file)
    try:
        token = add_token(path, name, role)
    except LabswarmError as exc:
        raise _fail(exc) from None
    print(token, flush=True)  # stdout alone: capturable; rich could wrap or style it
    err.print(f"added {name} ({role}) to {path}; the token above is shown this once: the file keeps its SHA-256 "
              "only. Restart the manager to load it.", highlight=False)


@tokens_app.command("list")
def list_tokens(file: TokensFile = None) -> None:
    """The users of the tokens file (names and roles; tokens are not stored)."""
    from labswarm.auth.tokens import load_tokens

    try:
        entries = load_tokens(_file(file))
    except LabswarmError as exc:
        raise _fail(exc) from None
    for entry in entries:
        console.print(f"{entry.user.name}\t{entry.user.role}", highlight=False)
