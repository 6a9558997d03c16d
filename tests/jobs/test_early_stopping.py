"""Early stopping through a job (issue 25, item 3): a real learner stops early, the job completes, and its event
stream carries a ``plateau`` event; what several learners cannot share yet is refused at submission."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError


def test_an_early_stopped_job_completes_with_a_plateau_event(tmp_path: Path) -> None:
    """~12 s. No loss improves by 100 nats: epoch 1 is the best, epoch 2 the plateau and the last of 5."""
    manifest = tiny_manifest(tmp_path, epochs=5)
    manifest["training"]["early_stopping"] = {"metric": "train_loss", "patience": 1, "min_delta": 100.0}
    with manager(tmp_path) as m:
        job = m.submit(manifest)
        events = read_events(m.http, job["id"])
        metrics = m.http.get(f"/v1/jobs/{job['id']}/metrics").json()
    assert statuses(events)[-1] == "completed"
    plateaus = [e["data"] for e in events if e["event"] == "plateau"]
    assert len(plateaus) == 1, [e["event"] for e in events]
    assert plateaus[0]["epoch"] == 2 and plateaus[0]["best_epoch"] == 1 and plateaus[0]["early_stop"] is True
    assert [r["epoch"] for r in metrics["metrics"]] == [1, 2], metrics


@pytest.mark.parametrize("training", [{"early_stopping": {"patience": 2}}, {"schedule": "reduce_on_plateau"}])
def test_what_several_learners_cannot_share_yet_is_refused(tmp_path: Path, training: dict) -> None:
    manifest = parse_manifest(tiny_manifest(tmp_path, learners=2, framework={"name": "allreduce"},
                                            training=training))
    with pytest.raises(ConfigError, match="not yet supported with 2 learners"):
        manifest.training_config()
