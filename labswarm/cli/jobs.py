"""``labswarm jobs ...``: submit, follow, inspect and steer training jobs on a running manager.

Each command takes ``--manager URL`` (default: ``LABSWARM_MANAGER_URL``, else ``http://127.0.0.1:8000``); the API
token comes from ``LABSWARM_API_TOKEN`` or ``--token-file PATH``, never from the command line. ``--json`` prints
the manager's answer for scripts. Any error is printed on stderr; the exit status says which kind
(:mod:`labswarm.cli.exits`): 2 for a bad manifest (each field with its path), an unknown job or a refused change,
3 when the manager cannot be reached; ``submit --follow`` exits 1 when the job fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from labswarm.cli.exits import FAILED, exit_code
from labswarm.cli.ids import job_ids, resolve
from labswarm.cli.output import LogConsole, plural
from labswarm.errors import LabswarmError
from labswarm.jobs.client.client import JobsClient
from labswarm.jobs.client.follow import epoch_line
from labswarm.jobs.client.follow import follow as follow_events

#: The manager a command talks to when neither ``--manager`` nor ``LABSWARM_MANAGER_URL`` says otherwise.
DEFAULT_MANAGER = "http://127.0.0.1:8000"

jobs_app = typer.Typer(help="Submit, follow, inspect and steer training jobs on a manager.", no_args_is_help=True)
console = LogConsole(highlight=False)
err = LogConsole(stderr=True, highlight=False)

Manager = Annotated[str, typer.Option(envvar="LABSWARM_MANAGER_URL", show_envvar=True, help="Manager URL.")]
TokenFile = Annotated[Path | None, typer.Option(
    exists=True, dir_okay=False, help="File holding the API token (default: LABSWARM_API_TOKEN).")]
Json = Annotated[bool, typer.Option("--json", help="Print the manager's answer as JSON.")]
JobId = Annotated[str, typer.Argument(help="Job id, or any unique start of it (see `labswarm jobs list`).")]
ManifestFile = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Job manifest (YAML).")]


def _call(manager: str, token_file: Path | None, call: Callable[[JobsClient], Any]) -> Any:
    """``call(client)``; a labswarm error is printed and exits with its status (:mod:`labswarm.cli.exits`)."""
    from labswarm.settings import load_settings

    token = token_file.read_text().strip() if token_file is not None else load_settings().api_token
    try:
        with JobsClient(manager, token or None) as client:
            return call(client)
    except LabswarmError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(exit_code(exc)) from None


def _id(client: JobsClient, job: str) -> str:
    """The job id that ``job`` (a whole id or a unique prefix) names (:mod:`labswarm.cli.ids`)."""
    return resolve(job, "job", lambda: job_ids(client))


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _show(job: dict[str, Any]) -> None:
    table = Table(title=f"job {job['id']} ({job['name']})", show_header=False)
    for label, value in (("status", job["status"]), ("reason", job.get("reason")),
                         ("error", f"{job['error_code']} ({job['fault']}): {job['error']}" if job.get("error_code")
                          else None),
                         ("experiment", job["experiment"]), ("priority", job["priority"]),
                         ("queue position", job.get("queue_position")), ("attempt", job["attempt"]),
                         ("restarts", f"user {job['restarts']['user']}, platform {job['restarts']['platform']}"),
                         ("checkpoint", (job.get("checkpoint") or {}).get("key"))):
        if value is not None:
            table.add_row(label, str(value))
    for state, moment in (job.get("timestamps") or {}).items():
        table.add_row(f"  {state}", moment)
    console.print(table)
    for attempt in job.get("attempts", []):
        console.print(f"attempt {attempt['number']}: {attempt['started_at']} -> {attempt['ended_at'] or '...'}  "
                      f"exit {attempt['exit_code']}  {attempt['error_code'] or ''} {attempt['reason'] or ''}",
                      markup=False)
    for line in job.get("log_tail") or []:
        console.print(f"  | {line}", markup=False)


def _follow(client: JobsClient, job_id: str, after: int = 0) -> dict[str, Any]:
    """Draw the job's events after ``after`` to its end (logs, a bar per epoch, metrics, status); the last
    status's data."""
    return follow_events(client.events(job_id, after=after), console)


@jobs_app.command()
def submit(manifest: ManifestFile, follow: Annotated[bool, typer.Option(
               "--follow", "-f", help="Show the job's log, a progress bar per epoch, its metrics and status changes "
               "until it ends.")] = False,
           manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None, as_json: Json = False) -> None:
    """Submit a job; with --follow, stream it to its end (exit 1 if it fails)."""

    def run(client: JobsClient) -> dict[str, Any]:
        job = client.submit(manifest)
        if as_json and not follow:
            _json(job)
        else:
            console.print(f"job {job['id']} submitted ({job['status']})")
        return _follow(client, job["id"]) if follow else job

    final = _call(manager, token_file, run)
    if follow and final.get("status") != "completed":
        raise typer.Exit(FAILED)


@jobs_app.command()
def validate(manifest: ManifestFile, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
             as_json: Json = False) -> None:
    """Check a manifest, its experiment and its stores without creating a job."""
    answer = _call(manager, token_file, lambda c: c.validate(manifest))
    _json(answer) if as_json else console.print(f"{manifest}: valid")


@jobs_app.command("list")
def list_jobs(status: Annotated[list[str] | None, typer.Option(help="Only jobs in this status (repeat).")] = None,
              name: Annotated[str | None, typer.Option(help="Only jobs of this name.")] = None,
              limit: Annotated[int, typer.Option(min=1, max=500)] = 50, manager: Manager = DEFAULT_MANAGER,
              token_file: TokenFile = None, as_json: Json = False) -> None:
    """Jobs, newest first."""
    page = _call(manager, token_file, lambda c: c.list(status=status, name=name, limit=limit))
    if as_json:
        _json(page)
        return
    table = Table("name", "owner", "status", "attempt", "priority", "queue", "submitted", "error")
    table.add_column("id", no_wrap=True, min_width=12)
    for job in page["jobs"]:
        table.add_row(job["name"], job.get("owner", ""), job["status"], str(job["attempt"]), str(job["priority"]),
                      str(job["queue_position"] or ""), job["submitted_at"][:19], job["error_code"] or "", job["id"])
    console.print(table)
    console.print(f"{len(page['jobs'])} of {plural(page['total'], 'job')}")


@jobs_app.command()
def show(job: JobId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None, as_json: Json = False) -> None:
    """A job: status, reason, error, timestamps per phase, attempts, and a failed job's log tail."""
    answer = _call(manager, token_file, lambda c: c.show(_id(c, job)))
    _json(answer) if as_json else _show(answer)


@jobs_app.command()
def logs(job: JobId, follow: Annotated[bool, typer.Option("--follow", "-f", help="Then follow the live log.")] = False,
         manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """The job's log; with -f, followed until the job ends (with a progress bar per epoch, metrics and status
    changes)."""

    def run(client: JobsClient) -> None:
        pos, job_id = 0, _id(client, job)
        for line in client.logs(job_id):
            console.print(line["line"], markup=False)
            pos = line["seq"]
        if follow:
            _follow(client, job_id, after=pos)

    _call(manager, token_file, run)


@jobs_app.command()
def metrics(job: JobId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None,
            as_json: Json = False) -> None:
    """The job's metrics records, each epoch once."""
    records = _call(manager, token_file, lambda c: c.metrics(_id(c, job)))
    if as_json:
        _json(records)
        return
    for record in records:
        console.print(epoch_line(record), markup=False)


@jobs_app.command()
def plot(job: JobId, output: Annotated[Path | None, typer.Option(help="The PNG to write (default ``<job>.png``).")]
         = None, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """Draw the job's loss and accuracy (train and validation) against epoch and against wall time as a PNG."""
    from labswarm.jobs.client.plot import plot_metrics

    job = _call(manager, token_file, lambda c: _id(c, job))
    records = _call(manager, token_file, lambda c: c.metrics(job))
    try:
        drawn = plot_metrics(records, output or Path(f"{job}.png"), title=f"job {job}")
    except LabswarmError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(exit_code(exc)) from None
    console.print(f"figure: {drawn.path}")


@jobs_app.command()
def halt(job: JobId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """Halt a job: its learners checkpoint and exit (resume continues from there)."""
    job = _call(manager, token_file, lambda c: _id(c, job))
    console.print(f"job {job}: {_call(manager, token_file, lambda c: c.halt(job))['status']}")


@jobs_app.command()
def resume(job: JobId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """Resume a halted job from its checkpoint."""
    job = _call(manager, token_file, lambda c: _id(c, job))
    console.print(f"job {job}: {_call(manager, token_file, lambda c: c.resume(job))['status']}")


@jobs_app.command()
def delete(job: JobId, manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """Delete a job: its processes, working folders and results (never the data it read)."""
    job = _call(manager, token_file, lambda c: _id(c, job))
    _call(manager, token_file, lambda c: c.delete(job))
    console.print(f"job {job} deleted")


@jobs_app.command()
def download(job: JobId, output: Annotated[Path | None, typer.Option(help="Where to write the file.")] = None,
             bundle: Annotated[bool, typer.Option(
                 "--bundle", help="The whole bundle (zip: model, logs, metrics, manifest, versions).")] = False,
             manager: Manager = DEFAULT_MANAGER, token_file: TokenFile = None) -> None:
    """Download the trained model (default ``<job>.pt`` here), or with --bundle the job's bundle (``<job>.zip``)."""
    job = _call(manager, token_file, lambda c: _id(c, job))
    if bundle:
        path = _call(manager, token_file, lambda c: c.download_bundle(job, output or Path(f"{job}.zip")))
    else:
        path = _call(manager, token_file, lambda c: c.download_model(job, output or Path(f"{job}.pt")))
    console.print(f"{'bundle' if bundle else 'model'}: {path}")
