"""``labswarm predict MODEL_OR_JOB AUDIO...``: classify audio files with a trained model (:mod:`labswarm.predict`).

``MODEL_OR_JOB`` is a model file, or (when no such file exists) a training job's id, or a unique start of it, whose
model is downloaded from the manager (``--manager``, default ``LABSWARM_MANAGER_URL``; the token from
``LABSWARM_API_TOKEN`` or ``--token-file``, never from the command line) into a temporary folder, removed
afterwards.

Exit status: 0 when every file was classified; 1 when some file could not be (its row says why, the others are
classified); 2 when there is no usable model (not a labswarm model file, corrupt, no job of that id or no model
of it yet); 3 when the manager that holds the job's model cannot be reached (:mod:`labswarm.cli.exits`).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from labswarm.cli.exits import FAILED, INFRASTRUCTURE, USAGE, exit_code
from labswarm.cli.ids import job_ids, resolve
from labswarm.cli.jobs import DEFAULT_MANAGER, Manager, TokenFile
from labswarm.cli.output import console, fail, plural, print_json
from labswarm.errors import LabswarmError, ManagerError


@contextlib.contextmanager
def model_file(model_or_job: str, manager: str, token_file: Path | None) -> Iterator[Path]:
    """The model file ``model_or_job`` names: itself when it exists, else the model of the training job of that
    id, downloaded through :class:`~labswarm.jobs.client.client.JobsClient` into a temporary folder (removed on exit).

    Raises:
        CheckpointError: no such file, and it does not look like a job id (it has a path separator or ``.pt``).
        ManagerError: the manager refused or could not be reached (unknown job, no model yet, bad token).
    """
    from labswarm.jobs.client.client import JobsClient
    from labswarm.settings import load_settings
    from labswarm.train.checkpoint import CheckpointError

    path = Path(model_or_job)
    if path.exists():
        yield path
        return
    if "/" in model_or_job or "\\" in model_or_job or path.suffix == ".pt":
        raise CheckpointError(f"{model_or_job}: no such model file")
    token = token_file.read_text().strip() if token_file is not None else load_settings().api_token
    with tempfile.TemporaryDirectory(prefix="labswarm-predict-") as folder:
        try:
            with JobsClient(manager, token or None) as client:
                job = resolve(model_or_job, "job", lambda: job_ids(client))  # a unique prefix will do
                downloaded = client.download_model(job, Path(folder) / f"{job}.pt")
        except ManagerError as exc:
            raise ManagerError(f"{model_or_job}: no such model file here, and no model of a job of that id from "
                               f"{manager}: {exc}", status=exc.status, detail=exc.detail) from None
        yield downloaded


def _table(predictions: list, top: int | None) -> Table:
    table = Table("file", "label", "probabilities", "windows", title=plural(len(predictions), "file"))
    for p in predictions:
        if p.error is not None:
            table.add_row(Text(p.path), Text("failed", style="bold red"), Text(p.error, style="red"), "")
            continue
        ranked = "  ".join(f"{label} {prob:.3f}" for label, prob in p.top(top))
        table.add_row(Text(p.path), Text(p.label, style="bold"), Text(ranked), str(p.windows))
    return table


def predict_command(
    model_or_job: Annotated[str, typer.Argument(
        metavar="MODEL_OR_JOB", help="A model file (`labswarm train`, `labswarm jobs download`), or a training "
        "job's id on the manager.")],
    audio: Annotated[list[Path], typer.Argument(help="Audio files to classify.")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print a JSON list of {path, label, probabilities, windows, error}.")] = False,
    top: Annotated[int | None, typer.Option(min=1, help="Show the K most probable classes (default: all).")] = None,
    manager: Manager = DEFAULT_MANAGER,
    token_file: TokenFile = None,
) -> None:
    """Classify audio files with a trained model: each file's label and class probabilities.

    Features are computed with the experiment's own extractors (the model file carries its configuration). A
    file longer than the experiment's segment is cut into consecutive segments whose probabilities are averaged.
    Exit status 1 when some file could not be classified (its row says why), 2 when the model is unusable.
    """
    from labswarm.predict import Predictor
    from labswarm.threads import limit_threads

    limit_threads(1)  # as every feature worker: two threads per pool made the mel projection 5-70x slower under load
    try:
        with model_file(model_or_job, manager, token_file) as path:
            predictor = Predictor(path)
    except LabswarmError as exc:  # no usable model: 2, unless the manager could not serve it (3)
        raise fail(exc, INFRASTRUCTURE if exit_code(exc) == INFRASTRUCTURE else USAGE) from None
    predictions = predictor.predict(audio)
    if as_json:
        print_json([p.to_dict(top) for p in predictions])
    else:
        console.print(_table(predictions, top))
    if any(p.error is not None for p in predictions):
        raise typer.Exit(FAILED)
