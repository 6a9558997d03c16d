"""labswarm/serve/fast.py: ``labswarm serve``'s short way to the prediction route answers as FastAPI's way does (the
same statuses, bodies and headers, on the app itself), and leaves FastAPI the requests whose query it does not
read as FastAPI would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from labswarm.serve import routes
from labswarm.serve.app import create_serving_app
from labswarm.serve.fast import FastPredict
from labswarm.settings import load_settings


def test_the_short_way_answers_as_fastapis_way(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~1-3 s (the model loaded twice, no worker process)."""
    monkeypatch.setenv("LABSWARM_API_TOKEN", "fast-test-token")
    clip = (model.parents[2] / "data" / "low" / "low_1.wav").read_bytes()
    fast, plain = (create_serving_app(model, "three", load_settings(), preload=False) for _ in range(2))
    plain.user_middleware = [m for m in plain.user_middleware if m.cls is not FastPredict]
    shortened: list[str] = []
    predict = routes.predict  # FastAPI's route keeps its own reference: only the short way calls this one

    async def counted(job: str, request: Any, **query: Any) -> Any:
        shortened.append(request.scope["query_string"].decode())
        return await predict(job, request, **query)

    monkeypatch.setattr(routes, "predict", counted)
    token = {"Authorization": "Bearer fast-test-token"}
    audio = {**token, "Content-Type": "audio/wav"}
    requests = [  # (query, headers, body, files)
        ("name=a.wav", audio, clip, None), ("top=1&name=b.wav", audio, clip, None), ("", audio, clip, None),
        ("top=0", audio, clip, None), ("top=01", audio, clip, None), ("name=a&name=b", audio, clip, None),
        ("other=1", audio, clip, None), ("name=" + "x" * 256, audio, clip, None),
        ("", {**token, "Content-Type": "text/plain"}, clip, None),
        ("", {"Authorization": "Bearer wrong", "Content-Type": "audio/wav"}, clip, None),
        ("", {"Content-Type": "audio/wav"}, clip, None), ("", token, None, {"other": (None, "x")}),
        ("", token, None, {"files": ("c.wav", clip, "audio/wav")})]

    async def send(app: Any) -> list[tuple[int, Any, dict[str, str]]]:
        answers = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as client:
            for query, headers, body, files in requests:
                answer = await client.post(f"/v1/models/three/predict?{query}", headers=headers, content=body,
                                           files=files)
                answers.append((answer.status_code, answer.json(), {k: v for k, v in answer.headers.items()
                                                                    if k != "content-length"}))
            missing = await client.post("/v1/models/nothing/predict", headers=audio, content=clip)
            answers.append((missing.status_code, missing.json(), dict(missing.headers)))
        return answers

    try:
        quick, slow = asyncio.run(send(fast)), asyncio.run(send(plain))
    finally:
        fast.state.models.close()
        plain.state.models.close()
    assert [a[0] for a in quick] == [200, 200, 200, 422, 200, 200, 200, 422, 415, 401, 401, 422, 200, 404], quick
    assert quick == slow
    assert quick[1][1]["results"][0]["path"] == "b.wav" and len(quick[1][1]["results"][0]["probabilities"]) == 1
    assert quick[5][1]["results"][0]["path"] == "b"  # a repeated parameter: FastAPI's (the last) value
    # the short way to the route (authenticated): the rest went FastAPI's way (the plain app: all)
    assert shortened == ["name=a.wav", "top=1&name=b.wav", "", "", "", "", ""], shortened
