"""The API docs page (``/docs``, Swagger UI) with its assets served by the manager itself, so that it works
offline: FastAPI's default page loads Swagger UI from a public CDN, a blank page without the internet.

The assets come from the ``swagger-ui-bundle-v2`` package (Swagger UI 5: OpenAPI 3.1, as FastAPI writes it),
served under ``/docs/static``. Like the schema (``/openapi.json``) they are not API routes: no token needed.
ReDoc (``/redoc``) has no local bundle and is not served.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

#: Where the page and its assets are served.
DOCS_URL = "/docs"
STATIC_URL = f"{DOCS_URL}/static"


def offline_docs(app: FastAPI) -> None:
    """Serve the Swagger UI page at :data:`DOCS_URL` with local assets (create the app with ``docs_url=None,
    redoc_url=None``)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(STATIC_URL, StaticFiles(directory=str(swagger_ui_path)), name="docs-static")
    redirect = f"{DOCS_URL}/oauth2-redirect"

    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/favicon-32x32.png", oauth2_redirect_url=f"{root}{redirect}")

    async def oauth2_redirect(_request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    # plain Starlette routes, like FastAPI's own docs routes: outside the schema and the app's auth dependency
    app.add_route(DOCS_URL, page, include_in_schema=False)
    app.add_route(redirect, oauth2_redirect, include_in_schema=False)
