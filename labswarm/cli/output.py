"""What the ``labswarm`` commands print: the consoles, errors, and the tables of sessions (rich).

On a terminal, output fits its width. Elsewhere (a pipe, a log file) nothing is cut or wrapped to fit 80
columns: tables take their natural width and lines stay whole (:class:`LogConsole`); ``COLUMNS`` still sets a
width when given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import typer
from rich.console import Console, ConsoleDimensions
from rich.table import Table

from labswarm.cli.exits import exit_code
from labswarm.errors import LabswarmError

#: The width of output that is not a terminal: wide enough that no table or line is cut or wrapped.
LOG_WIDTH = 10_000


class LogConsole(Console):
    """A rich console that, when its output is not a terminal and ``COLUMNS`` is not set, is :data:`LOG_WIDTH`
    columns wide instead of 80 (see the module)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        if self._width is None and not self.is_terminal and not self._environ.get("COLUMNS"):
            return ConsoleDimensions(LOG_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


console = LogConsole()
err = LogConsole(stderr=True)

#: The summary rows of a session (``GET /sessions/{id}``): label -> its value as text. ``labswarm run`` prints
#: them at the end of a run, ``labswarm sessions show`` for any session, ``list`` as columns.
SUMMARY: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("total", lambda p: str(p["total"])),
    ("done", lambda p: str(p["done"])),
    ("cached", lambda p: str(p["cached"])),
    ("failed", lambda p: str(p["failed"])),
    ("republished", lambda p: str(p["republished"])),
    ("done/s", lambda p: f"{p['samples_per_s']:.1f}"),
)
#: Rows ``labswarm sessions show`` adds below the summary.
DETAILS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("published", lambda p: str(p["published"])),
    ("pending", lambda p: str(p["pending"])),
    ("rate (tasks/s)", lambda p: f"{p['rate']:.2f}"),
    ("weight", lambda p: f"{p['weight']:g}"),
    ("launcher", lambda p: str(p.get("launcher", ""))),
    ("phase", lambda p: str(p.get("phase") or "")),
    ("started", lambda p: str(p.get("started_at") or "")),
    ("finished", lambda p: str(p.get("finished_at") or "")),
    ("error", lambda p: str(p.get("error") or "")),
)


def fail(exc: LabswarmError, code: int | None = None) -> typer.Exit:
    """Print ``error: <exc>`` on stderr; the :class:`typer.Exit` to raise, with status ``code``, by default the
    one that the error's kind means (:func:`labswarm.cli.exits.exit_code`)."""
    err.print(f"[bold red]error:[/] {exc}", highlight=False)
    return typer.Exit(exit_code(exc) if code is None else code)


def session_table(progress: Mapping[str, Any], seconds: float | None = None, *, details: bool = False) -> Table:
    """One session as a two-column table titled ``<experiment>: session <id> <status> in <s> s``.

    Args:
        progress: the session's progress (``GET /sessions/{id}``).
        seconds: the duration in the title; default the session's ``elapsed_s``.
        details: add the rate, weight, launcher, times and error below the summary rows.
    """
    seconds = progress.get("elapsed_s", 0.0) if seconds is None else seconds
    title = f"{progress['experiment']}: session {progress['id']} {progress['status']} in {seconds:.1f} s"
    table = Table(title=title, show_header=False, min_width=len(title))  # the title on one line, the id whole
    for label, value in SUMMARY + (DETAILS if details else ()):
        table.add_row(label, value(progress))
    return table


def sessions_table(sessions: Sequence[Mapping[str, Any]]) -> Table:
    """Sessions as rows: id, experiment, owner, status, the summary columns, and the publish rate."""
    table = Table(title="sessions")
    table.add_column("id", no_wrap=True, min_width=len(max((p["id"] for p in sessions), key=len, default="")))
    for column in ("experiment", "owner", "status"):  # the id whole, whatever the width (a person types it)
        table.add_column(column)
    for label, _ in SUMMARY:
        table.add_column(label, justify="right")
    table.add_column("rate (tasks/s)", justify="right")
    for p in sessions:
        table.add_row(p["id"], p["experiment"], p.get("owner", ""), p["status"], *(value(p) for _, value in SUMMARY),
                      f"{p['rate']:.2f}")
    return table


def print_session(progress: Mapping[str, Any], failures: Iterable[Mapping[str, Any]] = (),
                  seconds: float | None = None, *, details: bool = False, limit: int = 50) -> None:
    """Print a session's table, then its first ``limit`` failures (``sample_id: reason``)."""
    console.print(session_table(progress, seconds, details=details))
    failures = list(failures)
    for failure in failures[:limit]:
        console.print(f"  {failure['sample_id']}: {failure['reason']}", highlight=False, markup=False)
    if len(failures) > limit:
        console.print(f"  ... and {len(failures) - limit} more")


def plural(n: int, word: str, words: str | None = None) -> str:
    """``n`` and the noun that agrees with it: ``plural(1, "file")`` is ``1 file``, ``plural(2, "file")`` ``2 files``
    (``words``: an irregular plural, e.g. ``plural(n, "entry", "entries")``)."""
    return f"{n} {word if n == 1 else words or word + 's'}"


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (times as ISO 8601 text), for scripts."""
    typer.echo(json.dumps(data, indent=2, default=str))


def warn_password(option: str, url: str | None, variable: str) -> None:
    """Warn that a URL given on the command line shows its password to every user (``ps``)."""
    from labswarm.redact import has_password, redact_url

    if has_password(url):
        err.print(f"[bold yellow]warning:[/] {option} {redact_url(url)} carries a password, which `ps` shows to "
                  f"every user of this machine: set {variable} (or {variable}_FILE) instead", highlight=False)
