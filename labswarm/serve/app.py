"""``labswarm serve``'s app: the prediction endpoint alone, for one model file, without a manager or a database.

The same routes as on the manager (:mod:`labswarm.serve.routes`), under the model's name (the job id it came from,
or the file's stem), and the same authentication: ``LABSWARM_API_TOKEN`` / ``LABSWARM_TOKENS_FILE``; without a
token, loopback clients only. ``GET /health`` answers without one.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, FastAPI

from labswarm.auth.authenticator import Authenticator, BearerAuth
from labswarm.auth.limits import BodyLimit
from labswarm.serve import routes
from labswarm.serve.server import ModelServer
from labswarm.serve.settings import ServeSettings
from labswarm.serve.sources import FileModel
from labswarm.settings import Settings


def create_serving_app(model: Path, name: str, settings: Settings, serving: ServeSettings | None = None,
                       preload: bool = True) -> FastAPI:
    """An app serving ``model`` at ``/v1/models/{name}/predict``.

    Args:
        model: a model file (:class:`~labswarm.predict.Predictor`).
        name: the ``{job}`` of its URLs.
        settings: the tokens accepted (``api_token``, ``tokens_file``) and ``max_body_bytes``.
        serving: the endpoint's limits (default: from ``LABSWARM_PREDICT_*``).
        preload: load the model and start the feature processes now, so that a bad file fails here and the first
            request waits for nothing.

    Raises:
        CheckpointError: ``preload`` and the file is not a usable model.
        ConfigError: an invalid token setting.
    """
    authenticator = Authenticator.from_settings(settings)
    serving = serving or ServeSettings()
    server = ModelServer(FileModel(model, name), serving)
    server.on_loop = serving.lone_on_loop  # the app serves nothing else: a lone file may hold its event loop
    if preload:
        server.cache.get(name)
        server.features.warm()
    app = FastAPI(title="labswarm model server", version="0.1.0", dependencies=[Depends(BearerAuth(authenticator))],
                  description=f"Predictions of the model {name} ({model.name}).")
    app.state.auth = authenticator
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, routes=routes.body_limits(serving))

    @app.get("/health")
    def health() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    routes.mount(app, server)
    return app
