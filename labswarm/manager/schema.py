"""The manager's OpenAPI schema as the contract (issue 28): what FastAPI generates, completed where it cannot know.

- one error model: every 4xx body is ``{"detail": ...}`` (:data:`ERROR`): a message, or for a 422 the list of
  invalid fields ``[{"path": "dataset.root", "reason": "..."}]`` (:data:`VALIDATION_ERROR`; FastAPI declares its
  own ``{loc, msg, type}``, which the manager never sends);
- the bodies the handlers read themselves: an experiment (``POST /experiments``) and a manifest
  (``POST /v1/jobs``, ``POST /v1/jobs/validate``), as JSON or YAML;
- the error statuses each operation can answer: 401 and 429 (every operation but ``/health``: no valid token,
  too many wrong ones), 404 (an unknown or another user's object), 413 (a body over ``LABSWARM_MAX_BODY_BYTES``),
  and per operation 400, 403, 409, a quota's 429;
- the real media types of the downloads (``application/octet-stream``, ``application/zip``) and of the event
  streams (``text/event-stream``, and their 204);
- typed success answers: the JSON of each operation's 200/201 is the model :data:`labswarm.manager.responses.RESPONSES`
  names (the routes build their JSON themselves; the models describe it and change nothing it sends);
- a tag on every operation; operation ids are the handlers' names (stable; FastAPI's default appends the path
  and the method); ``/health`` is marked open (``security: []``).
"""

from __future__ import annotations

from functools import cache
from typing import Any, get_args, get_origin

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema

from labswarm.manager.responses import RESPONSES

FIELD_ERROR = {"type": "object", "title": "FieldError", "required": ["path", "reason"],
               "properties": {"path": {"type": "string", "description": "dotted path of the field, '' for the "
                                                                           "whole body"},
                              "reason": {"type": "string"}}}
#: A 4xx body: a message, or the invalid fields (a 422).
ERROR = {"type": "object", "title": "Error", "required": ["detail"],
         "properties": {"detail": {"anyOf": [{"type": "string"},
                                             {"type": "array", "items": {"$ref": "#/components/schemas/FieldError"}}]}}}
#: A 422 body: the invalid fields.
VALIDATION_ERROR = {"type": "object", "title": "ValidationError", "required": ["detail"],
                    "properties": {"detail": {"type": "array",
                                              "items": {"$ref": "#/components/schemas/FieldError"}}}}
_DOCUMENT = {"type": "object", "additionalProperties": True}
#: Operations whose body the handler reads itself: what it is.
BODIES = {
    "post_experiment": "the experiment, as its YAML file has it (docs/guides/experiment.md)",
    "create": "the job's manifest (docs/guides/jobs.md)",
    "validate": "the job's manifest (docs/guides/jobs.md)",
}
#: Statuses beyond 401/404/413/422, per operation id, with what they mean.
EXTRA = {
    "post_experiment": {409: "the name is another user's"},
    "start_session": {409: "the experiment has a session running, or its configuration no longer validates",
                      429: "the user's active_sessions or workers quota is reached (the message names it), or too "
                           "many wrong tokens"},
    "put_rate": {409: "the session has ended"}, "put_weight": {409: "the session has ended"},
    "put_workers": {409: "the session has ended, or the manager runs no workers for it",
                    429: "the session owner's workers quota is reached (the message names it), or too many wrong "
                         "tokens"},
    **{op: {403: "an admin's only"} for op in ("list_quotas", "show_quotas", "set_quotas", "clear_quotas")},
    "pause": {409: "refused in the session's state"}, "resume": {409: "refused in the session's state"},
    "cancel": {409: "the session has ended"},
    "create": {403: "framework: command is for admins", 429: "the user's queued_jobs quota is reached (the message "
                                                             "names it), or too many wrong tokens"},
    "validate": {403: "framework: command is for admins"},
    "change": {409: "refused in the job's state"},
    "model": {404: "no such job, another user's, or it has no trained model (yet)"},
    "stream": {400: "Last-Event-ID is not an event number"},
    "session_events": {400: "Last-Event-ID is not an event number"},
    "report": {403: "not this attempt's token", 409: "the attempt is over: the learner must stop"},
}
#: Other successes, per operation id: status, what it means (the same model as the operation's first success).
ALSO = {"create": ("200", "?reuse=true found a completed job of the caller with the same fingerprint: that job, "
                          "\"reused\": true, nothing queued")}
#: Binary and streamed answers: media type and schema of the 200, and an optional 204.
MEDIA = {
    "model": ("application/octet-stream", {"type": "string", "format": "binary"}, None),
    "bundle": ("application/zip", {"type": "string", "format": "binary"}, None),
    "stream": ("text/event-stream", {"type": "string"},
               "the job is over and every event up to its terminal status was sent"),
    "session_events": ("text/event-stream", {"type": "string"},
                       "a reconnection (Last-Event-ID) to an ended session"),
    "prometheus_metrics": ("text/plain", {"type": "string"}, None),
}
#: The tag of the operations whose router gives none, by the first segment of their path.
TAGS = {"experiments": "experiments", "sessions": "sessions", "settings": "workers", "health": "manager",
        "metrics": "manager"}
PUBLIC = {"/health"}


def operation_id(route: APIRoute) -> str:
    """The stable operation id of a route: its handler's name."""
    return route.name


def contract_openapi(app: FastAPI) -> dict[str, Any]:
    """``app``'s OpenAPI schema completed as the module says (cached on the app as FastAPI does)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description,
                             routes=app.routes)
        complete(schema)
        app.openapi_schema = schema
    return app.openapi_schema


@cache
def response_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON schemas of :data:`~labswarm.manager.responses.RESPONSES`: ``(components, by operation id)``; the
    components are the models (referenced as ``#/components/schemas/<Model>``), an operation's schema a reference
    to one, or an array of them."""
    def model(kind: Any) -> Any:
        return get_args(kind)[0] if get_origin(kind) is list else kind

    unique = list(dict.fromkeys(model(kind) for kind in RESPONSES.values()))
    refs, top = models_json_schema([(m, "serialization") for m in unique],
                                   ref_template="#/components/schemas/{model}")
    by_operation = {}
    for op, kind in RESPONSES.items():
        ref = refs[(model(kind), "serialization")]
        by_operation[op] = {"type": "array", "items": ref} if get_origin(kind) is list else ref
    return top.get("$defs", {}), by_operation


def complete(schema: dict[str, Any]) -> None:
    """Complete a schema FastAPI generated for the manager (see the module), in place."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    models, _ = response_schemas()
    if clash := sorted(set(models) & set(components)):
        raise ValueError(f"response models named like request models: {clash}")
    components.update(models)
    components.update(FieldError=FIELD_ERROR, Error=ERROR, ValidationError=VALIDATION_ERROR)
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            _operation(path, method, operation)


def _error(description: str, model: str = "Error") -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}}}


def _operation(path: str, method: str, operation: dict[str, Any]) -> None:
    op = operation.get("operationId", "")
    if not operation.get("tags"):
        operation["tags"] = [TAGS.get(path.strip("/").split("/")[0], "manager")]
    if op in BODIES:
        operation["requestBody"] = {"required": True, "description": BODIES[op], "content": {
            "application/json": {"schema": _DOCUMENT}, "application/yaml": {"schema": {"type": "string"}}}}
    responses = operation.setdefault("responses", {})
    typed = response_schemas()[1]
    if op in typed:
        success = next(code for code in ("200", "201") if code in responses)
        responses[success]["content"] = {"application/json": {"schema": typed[op]}}
        if op in ALSO:
            responses[ALSO[op][0]] = {"description": ALSO[op][1], "content": responses[success]["content"]}
    if op in MEDIA:
        media, body, empty = MEDIA[op]
        ok = responses.setdefault("200", {"description": "Successful Response"})
        ok["content"] = {media: {"schema": body}}
        if empty:
            responses["204"] = {"description": empty}
    if path in PUBLIC:
        operation["security"] = []
    else:
        responses.setdefault("401", _error("no token, or a token the manager does not accept"))
        responses.setdefault("429", _error("too many wrong tokens from this client address lately "
                                           "(LABSWARM_AUTH_FAILURE_BURST; Retry-After says when to try again)"))
    if "{" in path:
        responses.setdefault("404", _error("no such object, or another user's"))
    if "requestBody" in operation:
        responses.setdefault("413", _error("the body is over LABSWARM_MAX_BODY_BYTES"))
    if "requestBody" in operation or operation.get("parameters"):
        responses["422"] = _error("invalid fields, each with its path and the reason", "ValidationError")
    for status, description in EXTRA.get(op, {}).items():
        responses[str(status)] = _error(description)
