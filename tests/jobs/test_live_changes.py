"""Live changes of a running job's training (issue 25 item 5) on a real manager with two real learner processes
(``allreduce``): ``labswarm jobs set JOB learning_rate=...`` while epoch 1 runs lands at the start of the next
epoch on both learners, as their optimizers' own rate (read back by each learner, and in rank 0's metrics);
the job's manifest keeps it; a finished job refuses a change (409), bad values are 422s naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from train.three_classes import write_three_classes
from typer.testing import CliRunner

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.cli.main import app


def _set(url: str, *args: str):
    return CliRunner().invoke(app, ["jobs", "set", *args], env={"LABSWARM_MANAGER_URL": url, "COLUMNS": "200"})


def test_a_learning_rate_change_lands_at_the_next_epoch_on_every_learner(tmp_path: Path) -> None:
    """~60 s: two learners train three epochs."""
    write_three_classes(tmp_path / "data", per_class=32)  # epochs of several steps: the change lands mid-epoch
    manifest = tiny_manifest(tmp_path, epochs=3, learners=2, framework={"name": "allreduce"})
    manifest["training"].update(threads=1, learning_rate=0.01, schedule="constant")
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)["id"]
        read_events(m.http, job, until=lambda e: e["event"] == "progress" and e["data"].get("epoch") == 1)
        said = _set(m.server.url, job[:6], "learning_rate=0.003")
        bad = m.http.patch(f"/v1/jobs/{job}", json={"training": {"learning_rate": -1}})
        no_stopping = m.http.patch(f"/v1/jobs/{job}", json={"training": {"early_stopping": {"patience": 2}}})
        both = m.http.patch(f"/v1/jobs/{job}", json={"status": "halt", "training": {"learning_rate": 0.1}})
        stream = read_events(m.http, job)
        shown = m.show(job)
        metrics = m.http.get(f"/v1/jobs/{job}/metrics").json()["metrics"]
        late = m.http.patch(f"/v1/jobs/{job}", json={"training": {"learning_rate": 0.1}})
        unknown_key = _set(m.server.url, job, "momentum=0.9")
    assert statuses(stream)[-1] == "completed", [e for e in stream if e["event"] == "log"][-20:]
    assert said.exit_code == 0, said.output
    asked = [e["data"] for e in stream if e["event"] == "change" and "by" in e["data"]]
    assert len(asked) == 1 and asked[0]["training"] == {"learning_rate": 0.003}
    assert asked[0]["previous"] == {"learning_rate": 0.01}
    due = asked[0]["from_epoch"]
    assert due in (2, 3) and f"learning_rate 0.01 -> 0.003 from epoch {due}" in said.output
    applied = [e["data"] for e in stream if e["event"] == "change" and "rank" in e["data"]]
    assert sorted(a["rank"] for a in applied) == [0, 1]  # every learner, once
    for a in applied:
        assert a["epoch"] == due and not a["late"] and a["learning_rate"] == pytest.approx(0.003)
    assert [r["epoch"] for r in metrics] == [1, 2, 3]
    assert all(r["lr"] == pytest.approx(0.01 if r["epoch"] < due else 0.003) for r in metrics), metrics
    assert shown["manifest"]["training"]["learning_rate"] == 0.003  # the resolved manifest (and the bundle)
    assert bad.status_code == 422 and bad.json()["detail"][0]["path"] == "training.learning_rate"
    assert no_stopping.status_code == 422
    assert no_stopping.json()["detail"][0]["path"] == "training.early_stopping.patience"
    assert both.status_code == 422
    assert late.status_code == 409 and "completed" in late.json()["detail"]
    assert unknown_key.exit_code == 2 and "momentum" in unknown_key.output


def test_a_smaller_patience_ends_a_running_job_early(tmp_path: Path) -> None:
    """~30 s: one learner; train_loss watched in max mode never improves after epoch 1, so the job's 6 epochs end
    one epoch after the patience drops to 1 (the early stop keeps epoch 1's model)."""
    manifest = tiny_manifest(tmp_path, epochs=6)
    manifest["training"].update(threads=1, early_stopping={"metric": "train_loss", "mode": "max", "patience": 20})
    with manager(tmp_path) as m:
        job = m.submit(manifest)["id"]
        read_events(m.http, job, until=lambda e: e["event"] == "progress" and e["data"].get("epoch") == 1)
        said = _set(m.server.url, job, "patience=1")
        stream = read_events(m.http, job)
        metrics = m.http.get(f"/v1/jobs/{job}/metrics").json()["metrics"]
    assert said.exit_code == 0 and "patience 20 -> 1" in said.output, said.output
    assert statuses(stream)[-1] == "completed"
    [applied] = [e["data"] for e in stream if e["event"] == "change" and "rank" in e["data"]]
    assert applied["patience"] == 1 and applied["epoch"] >= 2
    assert len(metrics) < 6 and metrics[-1].get("early_stop") is True, metrics
    assert metrics[-1]["best_epoch"] < metrics[-1]["epoch"]
