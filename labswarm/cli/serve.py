"""``labswarm serve MODEL_OR_JOB``: the prediction endpoint alone (:mod:`labswarm.serve.app`), served by uvicorn,
without a manager or a database: a deployment of one trained model.

``MODEL_OR_JOB`` is a model file, or a training job's id (or a unique start of it) whose model is downloaded
from the manager as ``labswarm predict`` does (:func:`labswarm.cli.predict.model_file`), kept while it serves.
Exit status 2 when there is no usable model, 3 when the manager holding the job's model cannot be reached.
"""

from __future__ import annotations

from typing import Annotated

import typer

from labswarm.cli.exits import INFRASTRUCTURE, USAGE, exit_code
from labswarm.cli.jobs import DEFAULT_MANAGER, Manager, TokenFile
from labswarm.cli.output import err, fail
from labswarm.errors import LabswarmError


def serve_command(
    model_or_job: Annotated[str, typer.Argument(
        metavar="MODEL_OR_JOB", help="A model file (`labswarm train`, `labswarm jobs download`), or a training "
        "job's id on the manager (its model is downloaded once).")],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    name: Annotated[str | None, typer.Option(
        help="The model's name in the URL, /v1/models/NAME/predict (default: the job id, or the file's stem).")
    ] = None,
    manager: Manager = DEFAULT_MANAGER,
    token_file: TokenFile = None,
    access_log: Annotated[bool, typer.Option(
        "--access-log/--no-access-log", help="Log a line per request on stderr (uvicorn's access log; off by "
        "default: ~0.15 ms of the event loop a request, before its answer is written).")] = False,
) -> None:
    """Serve one trained model over HTTP: POST /v1/models/NAME/predict with audio files (multipart `files`, or
    one file as the whole body with ?name=) answers each file's label and class probabilities, as `labswarm
    predict --json` does.

    Clients authenticate with LABSWARM_API_TOKEN (or a token of LABSWARM_TOKENS_FILE) of this process: without
    one, a server on a non-loopback --host generates one and prints it once. Limits: LABSWARM_PREDICT_* (file size
    and duration, files a request, models and threads). OpenAPI docs at /docs.
    """
    from labswarm.auth.authenticator import ensure_token
    from labswarm.cli.predict import model_file
    from labswarm.manager.server import serve
    from labswarm.serve.app import create_serving_app
    from labswarm.settings import load_settings

    try:
        with model_file(model_or_job, manager, token_file) as path:
            settings = ensure_token(load_settings(), host)
            app = create_serving_app(path, name or path.stem, settings)
            if app.state.auth.open:
                err.print("note: no API token (LABSWARM_API_TOKEN, LABSWARM_TOKENS_FILE): this server answers "
                          "clients on this machine only", highlight=False)
            err.print(f"serving {path.name} at http://{host}:{port}/v1/models/{name or path.stem}/predict",
                      highlight=False)
            serve(app, host, port, access_log)
    except LabswarmError as exc:  # no usable model: 2, unless the manager could not serve it (3)
        raise fail(exc, INFRASTRUCTURE if exit_code(exc) == INFRASTRUCTURE else USAGE) from None
