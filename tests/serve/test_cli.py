"""``labswarm serve MODEL`` as its own process over real HTTP (uvicorn, no manager, no database): the model file's
predictions, a file over the size limit refused in its row, the token required, a bad model file exit 2; one file
as the whole body (no multipart) answered alike, one declaring a length over the limit refused unread (413
row), a chunked one past the limit 413, a body of another type 415, a form without a file 422."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jobs.manager import wait_until

from labswarm.manager.server import free_port
from labswarm.predict import predict


def test_labswarm_serve_answers_over_http_as_labswarm_predict(model: Path, tmp_path: Path) -> None:
    port, token = free_port(), "serve-test-token"
    env = {**os.environ, "LABSWARM_API_TOKEN": token, "LABSWARM_PREDICT_MAX_FILE_BYTES": "50000"}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "labswarm.cli", "serve", str(model), "--port", str(port),
                                    "--name", "three"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    data = model.parents[2] / "data"
    good = [data / "low" / "low_2.wav", data / "high" / "high_3.wav"]  # 1 s, 16-bit: ~44 kB each
    big = tmp_path / "big.wav"
    big.write_bytes(good[0].read_bytes() * 2)  # 88 kB: over the 50,000-byte limit (refused before decoding)
    files = [("files", (p.name, p.read_bytes(), "audio/wav")) for p in (good[0], big, good[1])]

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"labswarm serve exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 120, "labswarm serve answering /health")
        auth = {"Authorization": f"Bearer {token}"}
        answer = httpx.post(f"{url}/v1/models/three/predict", files=files, headers=auth, timeout=60)
        unknown = httpx.post(f"{url}/v1/models/other/predict", files=files[:1], headers=auth, timeout=60)
        no_token = httpx.post(f"{url}/v1/models/three/predict", files=files[:1], timeout=60)
        raw = [httpx.post(f"{url}/v1/models/three/predict", content=p.read_bytes(), timeout=60, params=params,
                          headers={**auth, **({"Content-Type": kind} if kind else {})})
               for p, kind, params in ((good[1], "audio/wav", {"name": "high_3.wav", "top": 1}),
                                       (good[0], "application/octet-stream", {}), (big, None, {"name": "big.wav"}))]
        unread = _declared_only(port, "/v1/models/three/predict?name=huge.wav", token, 10_000_000)
        chunked = httpx.post(f"{url}/v1/models/three/predict", params={"name": "big.wav"}, timeout=60, headers={
            **auth, "Content-Type": "audio/wav"}, content=_chunks(big.read_bytes(), 8192))
        urlencoded = httpx.post(f"{url}/v1/models/three/predict", data={"files": "x"}, headers=auth, timeout=60)
        no_file = httpx.post(f"{url}/v1/models/three/predict", data={"files": "x"}, files=[("other", files[0][1])],
                             headers=auth, timeout=60)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
    assert answer.status_code == 207, answer.text
    rows = answer.json()["results"]
    assert [r["status"] for r in rows] == [200, 413, 200]
    assert "over the limit of 50000" in rows[1]["error"] and rows[1]["path"] == "big.wav"
    for row, p in zip((rows[0], rows[2]), predict(model, good), strict=True):
        assert row["path"] == Path(p.path).name and row["label"] == p.label
        assert row["probabilities"] == pytest.approx(p.to_dict()["probabilities"], rel=0, abs=1e-6)
    assert unknown.status_code == 404 and "three" in unknown.json()["detail"]
    assert no_token.status_code == 401
    assert [a.status_code for a in raw] == [200, 200, 413], [a.text for a in raw]
    one, unnamed, too_big = (a.json()["results"] for a in raw)
    assert one[0]["path"] == "high_3.wav" and one[0]["label"] == rows[2]["label"]
    assert list(one[0]["probabilities"]) == [one[0]["label"]]  # top=1
    assert one[0]["probabilities"][one[0]["label"]] == pytest.approx(rows[2]["probabilities"][one[0]["label"]],
                                                                     rel=0, abs=1e-6)
    assert unnamed[0]["path"] == "file-0"
    assert unnamed[0]["probabilities"] == pytest.approx(rows[0]["probabilities"], rel=0, abs=1e-6)
    assert too_big[0]["path"] == "big.wav" and "over the limit of 50000" in too_big[0]["error"]
    # a Content-Length over the file limit: answered without the body (only 4 bytes of it were ever sent)
    assert unread.startswith(b"HTTP/1.1 413 "), unread[:500]
    huge = json.loads(unread.partition(b"\r\n\r\n")[2])["results"][0]
    assert huge["path"] == "huge.wav" and huge["error"].startswith("10000000 bytes: over the limit of 50000"), huge
    assert chunked.status_code == 413 and "Content-Length" not in chunked.request.headers
    assert chunked.json()["results"][0]["error"].startswith("at least "), chunked.text  # not read to its end
    assert urlencoded.status_code == 415 and "application/x-www-form-urlencoded" in urlencoded.json()["detail"]
    assert no_file.status_code == 422 and no_file.json()["detail"][0]["path"] == "files.0", no_file.text
    assert process.returncode == 0, log.read_text()[-3000:]
    logged = log.read_text()
    assert "Application startup complete" in logged and "POST /v1/models" not in logged  # no access log by default


def _declared_only(port: int, target: str, token: str, length: int) -> bytes:
    """POST to ``target`` with headers declaring a ``length``-byte audio body and send 4 bytes of it: the server's
    whole answer (headers and body, read to its ``Content-Length``), or a timeout if it waits for the rest."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: audio/wav\r\nContent-Length: {length}\r\n\r\nRIFF".encode())
        answer = b""
        while True:
            head, _, body = answer.partition(b"\r\n\r\n")
            sizes = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                     if line.startswith(b"content-length:")]
            if sizes and len(body) >= sizes[0]:
                return answer
            data = sock.recv(65536)  # socket.timeout (60 s) if the server waits for the body
            if not data:
                return answer
            answer += data


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in ``size``-byte pieces (httpx sends a generator chunked, with no ``Content-Length``)."""
    for start in range(0, len(data), size):
        yield data[start:start + size]


def test_labswarm_serve_refuses_a_file_that_is_not_a_model(tmp_path: Path) -> None:
    notes = tmp_path / "notes.pt"
    notes.write_text("not a model\n")
    done = subprocess.run([sys.executable, "-m", "labswarm.cli", "serve", str(notes), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not a labswarm model file" in done.stderr.replace("\n", " "), done.stderr
