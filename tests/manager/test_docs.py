"""Issue 29 item 6: ``/docs`` works offline: every asset it loads is served by the manager itself, without a
token (like the schema), and none comes from another host."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


def test_docs_load_only_the_managers_own_assets(tmp_path: Path) -> None:
    with EmbeddedServer(create_app(Settings(home=tmp_path / "home", api_token="t0ken"))) as server, \
            httpx.Client(base_url=server.url, timeout=10.0) as http:
        page = http.get("/docs")
        assert page.status_code == 200 and "SwaggerUIBundle" in page.text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", page.text)
        urls = [a or b for a, b in urls]
        assert {"/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/openapi.json"} <= set(urls)
        assert not [u for u in urls if "//" in u], urls  # no CDN, no other host
        for url in urls:
            answer = http.get(url)
            assert answer.status_code == 200 and len(answer.content) > 500, url
        assert http.get("/docs/static/swagger-ui-bundle.js").headers["content-type"].startswith(
            ("text/javascript", "application/javascript"))
        assert http.get("/redoc").status_code == 404  # not served: ReDoc has no local bundle
        assert http.get("/sessions").status_code == 401  # the API itself still needs the token
