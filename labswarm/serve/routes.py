"""The prediction endpoint's HTTP routes, ``/v1/models``: :data:`router`, on the manager (the models of its jobs)
and alone (``labswarm serve``). The app sets ``app.state.models``, a :class:`~labswarm.serve.server.ModelServer`
(:func:`mount` does both), and authenticates the routes (the manager's app-wide dependency).

=================================== ==================================================================
``GET /v1/models/{job}``            the model's classes, input feature, experiment, segment, limits, passes
``POST /v1/models/{job}/predict``   audio files (multipart ``files``, repeated) -> one result per file;
                                    or one file as the whole body (``?name=``) -> its result
=================================== ==================================================================

One file may come as the request's whole body, ``Content-Type`` ``application/octet-stream``, ``audio/*`` or
none, named by the query's ``name`` (``file-0`` without one): no multipart encoding for the client to build or
for the server to parse, the same answer. Another ``Content-Type`` is a 415; a multipart body without a ``files``
part, or with a ``files`` part that is not a file, a 422 naming it.

A result is the file's ``labswarm predict --json`` row (``path``: the name it was sent with; ``label``,
``probabilities``, ``windows``, ``error``) with its own ``status``: 200, 413 (over ``predict_max_file_bytes``
or ``predict_max_duration_s``) or 422 (cannot be decoded or classified). The answer is 200 when every file was
classified, 207 (Multi-Status) when some were, and otherwise the files' common status (413 or 422; 422 when
they differ), always with the list: ``{"model": job, "results": [...]}``. A request body over
``predict_max_request_bytes`` is refused whole with 413 before it is read; a one-file body is read no further
than ``predict_max_file_bytes`` (a ``Content-Length`` over it not at all, a chunked body up to the chunk that
passes it: its 413 row) and spooled as a multipart part is (in memory up to 1 MiB, then a temporary file); more
than ``predict_max_files`` files is a 422 naming ``files``. Another user's job is a 404, as on every jobs route;
a job not completed yet, 409.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, BinaryIO, cast

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from labswarm.errors import Conflict, NotFound
from labswarm.serve.cache import Served
from labswarm.serve.server import IN_MEMORY_BYTES, ModelServer, Upload
from labswarm.serve.settings import ServeSettings
from labswarm.train.checkpoint import CheckpointError

#: The prediction route's path, as :class:`~labswarm.auth.limits.BodyLimit` matches it.
PREDICT_PATH = r"/v1/models/[^/]+/predict"



@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Close ``app.state.models`` (its cached models' threads, its feature threads) when the app stops."""
    try:
        yield
    finally:
        app.state.models.close()


router = APIRouter(prefix="/v1/models", tags=["models"], lifespan=lifespan)


def mount(app: FastAPI, server: ModelServer) -> None:
    """Serve :data:`router` on ``app`` with ``server`` (``app.state.models``), closed when the app stops."""
    app.state.models = server
    app.include_router(router)


def body_limits(settings: ServeSettings) -> dict[str, tuple[int, str]]:
    """The request body limit of the prediction route, for :class:`~labswarm.auth.limits.BodyLimit`."""
    return {PREDICT_PATH: (settings.max_request_bytes, "predict_max_request_bytes")}


def _server(request: Request) -> ModelServer:
    return request.app.state.models


async def _served(request: Request, job: str):
    """The model of ``job`` for the caller, as HTTP errors: 404 (none, or not theirs), 409 (not completed), 422
    (its model file is not usable). A loaded model whose source checks without I/O is answered here, on the event
    loop (no hand-over to a thread and back: ``labswarm serve``'s model file); otherwise in a thread."""
    server, user = _server(request), getattr(request.state, "user", None)
    try:
        return server.model_now(job, user) or await run_in_threadpool(server.model, job, user)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    except CheckpointError as exc:
        raise HTTPException(422, str(exc)) from None


@router.get("/{job}")
async def describe_model(job: str, request: Request) -> dict[str, Any]:
    """The model of a completed job: its classes (the order of ``probabilities``), input feature, experiment,
    segment, the endpoint's limits, and its forward passes so far (``forward``: ``passes`` and ``rows``)."""
    await _served(request, job)
    return await run_in_threadpool(_server(request).describe, job, getattr(request.state, "user", None))


#: The prediction route's request body, as the OpenAPI schema declares it (the handler reads it itself).
_BODY = {"required": True, "description": "The audio files to classify (any format libsndfile decodes, any rate "
         "and channels): a multipart form with one `files` part per file; or one file as the whole body "
         "(`Content-Type` `application/octet-stream`, `audio/*` or none; its name in the `name` query parameter)",
         "content": {"multipart/form-data": {"schema": {
             "type": "object", "required": ["files"], "properties": {"files": {
                 "type": "array", "items": {"type": "string", "format": "binary"}}}}},
             "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}


@router.post("/{job}/predict", openapi_extra={"requestBody": _BODY}, responses={
    207: {"description": "some files classified, others refused"},
    400: {"description": "a multipart body that does not parse"},
    413: {"description": "every file refused for its size or length, or the request body over its limit"},
    415: {"description": "a body neither multipart/form-data nor one audio file (application/octet-stream, "
          "audio/*)"}})
async def predict(job: str, request: Request,
                  top: Annotated[int | None, Query(ge=1, description="Keep the K most probable classes")] = None,
                  name: Annotated[str | None, Query(min_length=1, max_length=255, description=(
                      "The file's name in its result (`path`) when the body is one file; default `file-0`"))
                  ] = None) -> JSONResponse:
    """Classify audio files with the model of a completed training job, as ``labswarm predict`` does: one result
    per file, in order, each with its HTTP status (see the module's table)."""
    server = _server(request)
    server.requests += 1  # on the event loop: no lock
    try:
        served = await _served(request, job)
        results = await _predicted(request, server, served, top, name)
    finally:
        server.requests -= 1
    statuses = {r["status"] for r in results}
    status = 200 if statuses == {200} else 207 if 200 in statuses else statuses.pop() if len(statuses) == 1 else 422
    return JSONResponse({"model": job, "results": results}, status_code=status)


async def _predicted(request: Request, server: ModelServer, served: Served, top: int | None, name: str | None
                     ) -> list[dict[str, Any]]:
    """The request's files (its multipart form or its whole body) through ``server``; a lone file computed on the
    event loop where :attr:`ModelServer.on_loop` allows it (see :meth:`ModelServer.predict`'s ``here``: the
    connection is the client's address and port; none for an address a proxy forwarded without a port, 0)."""
    client = request.scope.get("client") if server.on_loop else None
    here = tuple(client) if client and client[1] else None
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == "multipart/form-data":
        async with request.form() as form:  # closes the parts' temporary files
            return await server.predict(served, _parts(form.getlist("files"), server.settings.max_files), top,
                                        here)
    if media in ("", "application/octet-stream") or media.startswith("audio/"):
        upload, spool = await _body(request, name or "file-0", server.settings.max_file_bytes)
        try:
            return await server.predict(served, [upload], top, here)
        finally:
            if spool is not None:
                await spool.close()
    raise HTTPException(415, f"Content-Type {media}: send multipart/form-data (files), or one audio file as the "
                             "body with Content-Type application/octet-stream or audio/* (curl --data-binary "
                             "sends application/x-www-form-urlencoded unless told otherwise)")


def _parts(files: list[UploadFile | str], limit: int) -> list[Upload]:
    """The multipart ``files`` parts as uploads.

    Raises:
        HTTPException: 422 naming ``files``: none, more than ``limit``, or a part that is not a file.
    """
    if not files:
        raise HTTPException(422, [{"path": "files", "reason": "no file: send one multipart part named files per "
                                   "audio file"}])
    if len(files) > limit:
        raise HTTPException(422, [{"path": "files", "reason": f"{len(files)} files: over the limit of {limit} a "
                                   "request (setting predict_max_files)"}])
    uploads = []
    for i, part in enumerate(files):
        if isinstance(part, str):
            raise HTTPException(422, [{"path": f"files.{i}", "reason": "a form field, not a file (the part has no "
                                       "filename)"}])
        uploads.append(Upload(part.filename or f"file-{i}", part.file,
                              part.size if part.size is not None else _size(part)))
    return uploads


async def _body(request: Request, name: str, limit: int) -> tuple[Upload, UploadFile | None]:
    """The request's whole body as one upload named ``name``, and the spool holding it (to close) if any.

    Read no further than ``limit`` bytes (``max_file_bytes``): a ``Content-Length`` over it is not read at all
    (its upload: that size, no bytes), a body without one (chunked) stops at the chunk that passes it (its upload:
    the bytes read, ``whole`` false); either is refused in its row with 413. A ``Content-Length`` of at most
    :data:`IN_MEMORY_BYTES` (a 10-s clip) is read into memory: its chunks (uvicorn gave a 441-KB body in 2) joined
    once into a :class:`io.BytesIO`. Another body is spooled as Starlette spools a multipart part: in memory up to
    1 MiB, then a temporary file, written in a thread (Starlette's
    :meth:`~starlette.datastructures.UploadFile.write`)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return Upload(name, io.BytesIO(), int(declared)), None
    size = 0
    if declared.isdigit() and int(declared) <= IN_MEMORY_BYTES:
        chunks = []
        async for chunk in request.stream():
            size += len(chunk)
            chunks.append(chunk)
        return Upload(name, io.BytesIO(b"".join(chunks)), size, whole=size <= limit), None
    spool = UploadFile(cast(BinaryIO, tempfile.SpooledTemporaryFile(  # noqa: SIM115 (the caller closes it)
        max_size=IN_MEMORY_BYTES)), size=0)
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return Upload(name, spool.file, size, whole=False), spool
            await spool.write(chunk)
        await spool.seek(0)
    except BaseException:  # the client went away mid-body
        await spool.close()
        raise
    return Upload(name, spool.file, size), spool


def _size(upload: UploadFile) -> int:
    handle = upload.file
    here = handle.tell()
    size = handle.seek(0, 2)
    handle.seek(here)
    return size
