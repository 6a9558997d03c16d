"""``HEAD`` wherever ``GET`` is on the dashboard (issue 29, item 9: ``HEAD /ui/`` was a 405): the same status and
headers as the ``GET``, no content; through a real manager served over HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


def test_head_answers_as_get_without_content(tmp_path: Path) -> None:
    server = EmbeddedServer(create_app(Settings(home=tmp_path, api_token="t0ken-of-this-test"))).start()
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer t0ken-of-this-test"}) as http:
            for path in ("/ui/", "/ui/static/ui.css", "/ui/login"):
                get, head = http.get(path), http.head(path)
                assert get.status_code == 200, (path, get.status_code)
                assert head.status_code == 200 and head.content == b"", (path, head.status_code)
                assert head.headers["content-type"] == get.headers["content-type"]
            assert http.head("/ui/", headers={"Authorization": ""}).status_code == 401  # no login: as GET
            assert http.post("/ui/").status_code == 405  # only HEAD is added
    finally:
        server.stop()
