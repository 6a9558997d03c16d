"""Generate the REST reference (mkdocs-gen-files) from the manager's OpenAPI schema, at build time.

The manager's app is built as ``labswarm manager`` builds it (its ``create_app`` factory, found by walking
``labswarm.manager`` with griffe, so a move inside the package needs no change here), on settings whose home is
a temporary folder; ``app.openapi()`` gives the schema: no server runs, nothing is fetched. The page lists every
operation (method, path, summary, tag) and then each one's description, parameters, request body and
responses. The schema itself is published beside it as ``reference/openapi.json`` (no Swagger UI: it would
load its scripts from a CDN; every manager serves its own at ``/docs``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import tempfile
from pathlib import Path

import griffe
import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, cell, paragraphs

FACTORY = "create_app"
METHODS = ("get", "post", "put", "patch", "delete")
#: the group of the operations that have no tag in the schema (the manager's own routes and the sessions').
UNTAGGED = "untagged"


def find_factory():
    """The ``create_app`` function defined in a module of ``labswarm.manager``."""
    package = griffe.load("labswarm.manager", search_paths=[str(ROOT)], resolve_aliases=False)
    stack = [package]
    while stack:
        module = stack.pop()
        member = module.members.get(FACTORY)
        if member is not None and not member.is_alias and member.is_function:
            return getattr(importlib.import_module(module.path), FACTORY)
        stack.extend(module.modules.values())
    raise RuntimeError(f"no {FACTORY}() in labswarm.manager: docs/scripts/gen_rest.py must learn where the app is")


def build_schema() -> dict:
    from labswarm.settings import Settings

    factory = find_factory()
    with tempfile.TemporaryDirectory() as home:
        settings = Settings(home=Path(home), api_token="docs-build-token-not-a-secret-0123456789abcdef")
        app = factory(settings) if inspect.signature(factory).parameters else factory()
        schema = app.openapi()
        engine = getattr(getattr(app.state, "sessions", None), "engine", None)
        if engine is not None:
            engine.dispose()
    return schema


def ref_name(schema: dict | None) -> str:
    """A short name for a (possibly referenced) JSON schema."""
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"array of {ref_name(schema.get('items'))}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(ref_name(s) for s in schema[key])
    return schema.get("type", "object")


def slug(method: str, path: str) -> str:
    return (method + path).lower().replace("/", "-").replace("{", "").replace("}", "").replace("_", "-")


def render(schema: dict) -> str:
    info = schema.get("info", {})
    ops = [(tag, method, path, op)
           for path, item in schema.get("paths", {}).items()
           for method, op in item.items() if method in METHODS
           for tag in [(op.get("tags") or [UNTAGGED])[0]]]
    out = [
        "# REST API\n",
        f"Generated at build time from the OpenAPI schema of the manager's app ({info.get('title', '')} "
        f"{info.get('version', '')}; `docs/scripts/gen_rest.py`): {len(ops)} operations. The schema itself: "
        "[openapi.json](openapi.json). A running manager serves it at `/openapi.json` and an interactive page at "
        "`/docs`. Every route but `GET /health` needs `Authorization: Bearer <token>` "
        "(see [Security](../security.md)).\n",
    ]
    if info.get("description"):
        out.append(paragraphs(info["description"]) + "\n")
    out.append("| method | path | summary | tag |\n|---|---|---|---|")
    for tag, method, path, op in ops:
        out.append(f"| {method.upper()} | [`{path}`](#{slug(method, path)}) | {cell(op.get('summary'))} | {tag} |")
    out.append("")
    for tag in dict.fromkeys(t for t, *_ in ops):
        out.append(f"## {tag}\n")
        for _, method, path, op in (o for o in ops if o[0] == tag):
            out.append(f"### {method.upper()} `{path}` {{#{slug(method, path)}}}\n")
            out.append(f"**{cell(op.get('summary'))}**\n")
            if op.get("description"):
                out.append(paragraphs(op["description"]) + "\n")
            params = op.get("parameters", [])
            if params:
                out.append("| parameter | in | type | required | description |\n|---|---|---|---|---|")
                for p in params:
                    out.append(f"| `{p['name']}` | {p.get('in', '')} | {cell(ref_name(p.get('schema')))} | "
                               f"{'yes' if p.get('required') else 'no'} | {cell(p.get('description'))} |")
                out.append("")
            body = op.get("requestBody")
            if body:
                content = body.get("content", {}).items()
                kinds = ", ".join(f"`{k}` {cell(ref_name(v.get('schema')))}" for k, v in content)
                out.append(f"Request body{' (required)' if body.get('required') else ''}: {kinds}\n")
            responses = op.get("responses", {})
            if responses:
                out.append("Responses: " + "; ".join(
                    f"`{code}` {cell(r.get('description'))}" for code, r in responses.items()) + "\n")
    return "\n".join(out) + "\n"


def main() -> None:
    schema = build_schema()
    with mkdocs_gen_files.open("reference/rest.md", "w") as f:
        f.write(render(schema))
    with mkdocs_gen_files.open("reference/openapi.json", "w") as f:
        json.dump(schema, f, indent=1)
    mkdocs_gen_files.set_edit_path("reference/rest.md", "docs/scripts/gen_rest.py")


main()
