"""``training.init_from: {model: PATH}`` on a shared manager (reviewer's defect): the learner reads the file as
the manager's OS user, so a user could fine-tune from another user's model by its path where ``{job: ID}`` checks
the owner. A model path is an admin's only, as ``model: {code: ...}``: 403 naming the field for a user at validate
and create (in the manifest's training or the experiment's), accepted from an admin."""

from __future__ import annotations

from pathlib import Path

import httpx

from jobs.manager import manager
from jobs.tiny import tiny_manifest
from labswarm.auth.tokens import add_token


def test_a_model_file_to_fine_tune_from_is_an_admin_s_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("LABSWARM_API_TOKEN", raising=False)
    secret = tmp_path / "root-results" / "model.pt"  # another user's model: its bytes are never read here
    secret.parent.mkdir()
    secret.write_bytes(b"not read by a refused submission")
    in_training = tiny_manifest(tmp_path, name="steal")
    in_training["training"]["init_from"] = {"model": str(secret)}
    in_experiment = tiny_manifest(tmp_path, name="steal2")
    in_experiment["experiment"] = {**in_experiment["experiment"], "name": "bobs",
                                   "training": {**in_experiment["experiment"].get("training", {}),
                                                "init_from": {"model": str(secret)}}}
    tokens = tmp_path / "tokens.yaml"
    bob, root = add_token(tokens, "bob", "user"), add_token(tokens, "root", "admin")
    with manager(tmp_path, tokens_file=tokens) as m:
        def post(token: str, route: str, manifest: dict) -> httpx.Response:
            return m.http.post(route, json=manifest, headers={"Authorization": f"Bearer {token}"})

        refused = [post(bob, route, manifest) for route in ("/v1/jobs/validate", "/v1/jobs")
                   for manifest in (in_training, in_experiment)]
        listed = m.http.get("/v1/jobs", headers={"Authorization": f"Bearer {bob}"})
        admitted = post(root, "/v1/jobs/validate", in_training)
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert "training.init_from.model" in answer.json()["detail"], answer.text
    assert listed.status_code == 200 and listed.json()["jobs"] == [], listed.text
    assert admitted.status_code == 200, admitted.text
