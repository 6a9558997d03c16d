"""The dashboard shows a user their own experiments and jobs only, as the API does (issue 11: owners): over real
HTTP against a real manager with a tokens file, pages read with the bearer header (the page routes accept it
as they accept the login cookie). No browser: what a page holds is the server's HTML."""

from __future__ import annotations

from pathlib import Path

import httpx
from helpers import experiment_dict, write_dataset
from jobs.manager import manager
from jobs.tiny import tiny_manifest

from labswarm.auth.tokens import add_token
from ui.compare_files import write_compare


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_pages_show_a_user_their_own_objects_and_an_admin_everything(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens_of = {name: add_token(tokens, name, role) for name, role in
                 (("alice", "user"), ("bob", "user"), ("root", "admin"))}
    data = tmp_path / "audio"
    write_dataset(data)
    experiment = experiment_dict(data, tmp_path / "store", name="alices-experiment")
    with manager(tmp_path, tokens_file=tokens) as m:  # the job's learner runs on; the fixture kills it at the end
        alice, bob, root = (_client(m.server.url, tokens_of[n]) for n in ("alice", "bob", "root"))
        with alice, bob, root:
            assert alice.post("/experiments", json=experiment).status_code == 201
            job = alice.post("/v1/jobs", json=tiny_manifest(tmp_path, name="alices-job", epochs=1))
            assert job.status_code == 201, job.text
            job_id = job.json()["id"]

            for caller in (alice, root):
                page = caller.get("/ui/")
                assert page.status_code == 200
                assert "alices-experiment" in page.text and job_id in page.text
                assert caller.get(f"/ui/jobs/{job_id}").status_code == 200
            page = bob.get("/ui/")
            assert page.status_code == 200
            assert "alices-experiment" not in page.text and job_id not in page.text
            assert "alices-job" not in bob.get("/ui/partials/overview").text
            assert bob.get(f"/ui/jobs/{job_id}").status_code == 404


def test_comparison_runs_are_an_admins_and_their_recorded_owners(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens_of = {name: add_token(tokens, name, role) for name, role in
                 (("alice", "user"), ("bob", "user"), ("root", "admin"))}
    home = tmp_path / "home"
    write_compare(home, run="alices-run", owner="alice")
    write_compare(home, ("easgd",), run="nobodys-run")
    (home / "compare" / "broken").mkdir()
    (home / "compare" / "broken" / "compare.json").write_text("{not json")
    with manager(tmp_path, tokens_file=tokens) as m:
        alice, bob, root = (_client(m.server.url, tokens_of[n]) for n in ("alice", "bob", "root"))
        with alice, bob, root:
            listed = root.get("/ui/compare")
            assert listed.status_code == 200
            assert "alices-run" in listed.text and "nobodys-run" in listed.text and "broken" not in listed.text
            assert root.get("/ui/compare/nobodys-run").status_code == 200
            assert root.get("/ui/compare/broken").status_code == 404
            page = alice.get("/ui/compare")
            assert "alices-run" in page.text and "nobodys-run" not in page.text
            shown = alice.get("/ui/compare/alices-run")
            assert shown.status_code == 200 and 'data-framework="downpour"' in shown.text
            assert alice.get("/ui/compare/nobodys-run").status_code == 404
            assert "alices-run" not in bob.get("/ui/compare").text
            assert bob.get("/ui/compare/alices-run").status_code == 404
            # a run is one folder name under compare/, nothing else
            for name in ("..%2F..%2Ftokens.yaml", ".hidden", "alices-run%2Fcompare.json"):
                assert root.get(f"/ui/compare/{name}").status_code == 404, name
        assert httpx.get(f"{m.server.url}/ui/compare/alices-run").status_code == 401
