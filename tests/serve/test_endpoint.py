"""``POST /v1/models/{job}/predict`` on a real manager (uvicorn, real HTTP) serving the model of a job that a real
learner process trained: the same probabilities as ``labswarm predict`` on the downloaded model, per-file refusals
(413 too long, 422 undecodable) beside the answered files, and the job's owners (another user's job is a 404)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest

from labswarm.auth.tokens import add_token
from labswarm.predict import predict


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)


def _files(paths: list[Path]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("files", (p.name, p.read_bytes(), "audio/wav")) for p in paths]


def test_the_endpoint_answers_labswarm_predicts_probabilities_and_refuses_a_long_file_beside_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~20 s: a real learner trains the job's one epoch."""
    monkeypatch.setenv("LABSWARM_PREDICT_MAX_DURATION_S", "2.5")
    monkeypatch.setenv("LABSWARM_PREDICT_MAX_FILES", "5")
    tokens = {name: add_token(tmp_path / "tokens.yaml", name, role)
              for name, role in (("alice", "user"), ("bob", "user"), ("root", "admin"))}
    manifest = tiny_manifest(tmp_path, epochs=1)
    data = tmp_path / "data"
    low, sr = sf.read(data / "low" / "low_1.wav", dtype="float32")
    noise, _ = sf.read(data / "noise" / "noise_2.wav", dtype="float32")
    sf.write(tmp_path / "two.wav", np.concatenate([low, noise]), sr)  # two windows, averaged
    sf.write(tmp_path / "long.wav", np.concatenate([low, noise, low]), sr)  # 3 s: over the 2.5-s limit
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    good = [data / "high" / "high_0.wav", tmp_path / "two.wav", data / "noise" / "noise_4.wav"]
    sent = [good[0], tmp_path / "long.wav", good[1], tmp_path / "corrupt.wav", good[2]]
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml") as m:
        alice, bob, root = (_client(m.server.url, tokens[n]) for n in ("alice", "bob", "root"))
        created = alice.post("/v1/jobs", json=manifest)
        assert created.status_code == 201, created.text
        job = created.json()["id"]
        early = alice.post(f"/v1/models/{job}/predict", files=_files(good[:1]))
        assert early.status_code in (409, 200), early.text  # 409 while it trains (it may already be done)
        assert statuses(read_events(alice, job))[-1] == "completed"
        (tmp_path / "model.pt").write_bytes(alice.get(f"/v1/jobs/{job}/model").content)

        answer = alice.post(f"/v1/models/{job}/predict", files=_files(sent))
        by_admin = root.post(f"/v1/models/{job}/predict", files=_files(good[:1]), params={"top": 1})
        other_user = bob.post(f"/v1/models/{job}/predict", files=_files(good[:1]))
        no_token = httpx.post(f"{m.server.url}/v1/models/{job}/predict", files=_files(good[:1]))
        too_many = alice.post(f"/v1/models/{job}/predict", files=_files(good * 2))
        only_bad = alice.post(f"/v1/models/{job}/predict", files=_files([tmp_path / "long.wav"]))
        described = alice.get(f"/v1/models/{job}")
        loads = m.server.app.state.models.cache.loads
        for client in (alice, bob, root):
            client.close()

    assert answer.status_code == 207, answer.text  # some answered, some refused
    body = answer.json()
    assert body["model"] == job
    rows = body["results"]
    assert [r["path"] for r in rows] == [p.name for p in sent]
    assert [r["status"] for r in rows] == [200, 413, 200, 422, 200]
    assert "over the limit of 2.5 s" in rows[1]["error"] and rows[1]["label"] is None
    assert rows[3]["error"].startswith("AudioError: corrupt.wav") and str(tmp_path) not in rows[3]["error"]
    # decoded from memory (a small upload): libsndfile's message names the upload, not its file object's repr
    assert "Error opening 'corrupt.wav'" in rows[3]["error"] and "0x" not in rows[3]["error"], rows[3]
    expected = predict(tmp_path / "model.pt", good)
    for row, p in zip((rows[0], rows[2], rows[4]), expected, strict=True):
        assert row["label"] == p.label and row["windows"] == p.windows and row["error"] is None
        assert row["probabilities"] == pytest.approx(p.to_dict()["probabilities"], rel=0, abs=1e-6)
        assert list(row["probabilities"]) == list(p.to_dict()["probabilities"])  # most probable first, as --json
    assert rows[2]["windows"] == 2
    assert by_admin.status_code == 200 and len(by_admin.json()["results"][0]["probabilities"]) == 1
    assert other_user.status_code == 404 and other_user.json()["detail"] == f"no job {job!r}"
    assert no_token.status_code == 401
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["path"] == "files"
    assert only_bad.status_code == 413 and only_bad.json()["results"][0]["status"] == 413
    assert described.status_code == 200 and described.json()["classes"] == list(expected[0].probabilities)
    assert loads == 1  # loaded once, kept warm for every later request
