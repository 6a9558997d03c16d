"""``labswarm sessions ...``: list, inspect and steer the sessions of a running manager over its HTTP API.

Each command takes ``--manager URL`` (default: ``LABSWARM_MANAGER_URL``, else ``http://127.0.0.1:8000``) and
``--json`` (the manager's answer as JSON, for scripts). The API token comes from ``LABSWARM_API_TOKEN`` or from
``--token-file PATH``, never from the command line (where ``ps`` and the shell history would show it). Any error
is printed on stderr; the exit status says which kind (:mod:`labswarm.cli.exits`): 2 for an unknown session or a
refused change, 3 when the manager cannot be reached.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from labswarm.cli.ids import resolve, session_ids
from labswarm.cli.output import console, fail, print_json, print_session, sessions_table
from labswarm.client import ManagerClient
from labswarm.errors import LabswarmError

#: The manager a command talks to when neither ``--manager`` nor ``LABSWARM_MANAGER_URL`` says otherwise.
DEFAULT_MANAGER = "http://127.0.0.1:8000"

sessions_app = typer.Typer(help="List, inspect and steer the sessions of a running manager.", no_args_is_help=True)

Manager = Annotated[str, typer.Option(envvar="LABSWARM_MANAGER_URL", show_envvar=True, help="Manager URL.")]
TokenFile = Annotated[Path | None, typer.Option(
    exists=True, dir_okay=False, help="File holding the API token (default: LABSWARM_API_TOKEN).")]
Json = Annotated[bool, typer.Option("--json", help="Print the manager's answer as JSON.")]
SessionId = Annotated[str, typer.Argument(help="Session id, or any unique start of it (see `labswarm sessions "
                                                "list`).")]


def _client(manager: str, token_file: Path | None) -> ManagerClient:
    """A client of ``manager`` with the token of ``token_file``, else ``LABSWARM_API_TOKEN``."""
    from labswarm.settings import load_settings

    token = token_file.read_text().strip() if token_file is not None else load_settings().api_token
    return ManagerClient(manager, token or None)


def _call(manager: str, token_file: Path | None, call: Callable[[ManagerClient], Any]) -> Any:
    """``call(client)``; a labswarm error is printed and exits with its status (:mod:`labswarm.cli.exits`)."""
    try:
        with _client(manager, token_file) as client:
            return call(client)
    except LabswarmError as exc:
        raise fail(exc) from None


def _id(client: ManagerClient, session: str) -> str:
    """The session id that ``session`` (a whole id or a unique prefix) names (:mod:`labswarm.cli.ids`)."""
    return resolve(session, "session", lambda: session_ids(client))


def _show(progress: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(progress)
    else:
        print_session(progress, details=True)


@sessions_app.command("list")
def list_sessions(manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None, as_json: Json = False) -> None:
    """The sessions the token may see (a user: their own; an admin: all), newest first: owner, status, progress
    and publish rate."""
    sessions = _call(manager, token_file, lambda c: c.sessions())
    if as_json:
        print_json(sessions)
    elif not sessions:
        console.print("no session")
    else:
        console.print(sessions_table(sessions))


@sessions_app.command()
def show(session: SessionId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
         as_json: Json = False) -> None:
    """A session's progress, rate, weight and launcher, and its first failures with their reasons."""

    def get(client: ManagerClient) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        progress = client.session(_id(client, session))
        return progress, (client.failures(progress["id"]) if progress["failed"] else [])

    progress, failures = _call(manager, token_file, get)
    if as_json:
        print_json({**progress, "failures": failures})
    else:
        print_session(progress, failures, details=True)


@sessions_app.command()
def pause(session: SessionId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
          as_json: Json = False) -> None:
    """Stop publishing (the workers finish what is queued)."""
    _show(_call(manager, token_file, lambda c: c.pause(_id(c, session))), as_json)


@sessions_app.command()
def resume(session: SessionId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
           as_json: Json = False) -> None:
    """Publish again."""
    _show(_call(manager, token_file, lambda c: c.resume(_id(c, session))), as_json)


@sessions_app.command()
def cancel(session: SessionId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
           as_json: Json = False) -> None:
    """Stop publishing, purge the queue and end the session (its workers stop if the manager runs them)."""
    _show(_call(manager, token_file, lambda c: c.cancel(_id(c, session))), as_json)


@sessions_app.command()
def rate(session: SessionId,
         tasks_per_s: Annotated[float, typer.Argument(min=0.001, metavar="RATE", help="Publish rate in tasks/s.")],
         manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None, as_json: Json = False) -> None:
    """Set the publish rate in tasks/s (a running health controller sets it again at its next decision)."""
    _show(_call(manager, token_file, lambda c: c.set_rate(_id(c, session), tasks_per_s)), as_json)


@sessions_app.command()
def weight(session: SessionId,
           share: Annotated[float, typer.Argument(min=0.001, metavar="WEIGHT",
                                                  help="Share of shared workers, relative to other sessions.")],
           manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None, as_json: Json = False) -> None:
    """Set the session's weight: its share of the workers it shares with other sessions."""
    _show(_call(manager, token_file, lambda c: c.set_weight(_id(c, session), share)), as_json)


@sessions_app.command()
def workers(session: SessionId,
            count: Annotated[int, typer.Argument(min=0, metavar="N", help="Workers to run from now on.")],
            manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None, as_json: Json = False) -> None:
    """Scale the workers of a session whose launcher the manager runs (`local` or `swarm`)."""
    progress = _call(manager, token_file, lambda c: c.set_workers(_id(c, session), count))
    if as_json:
        print_json(progress)
    else:
        print_session(progress, details=True)
        console.print(f"workers: {progress['workers']}")
