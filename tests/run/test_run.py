"""`labswarm run` trains through a training job of its embedded manager (issue 12, item 9): the console script on
a small experiment, then a manager opened on the same home lists the job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


@pytest.mark.slow  # the whole main command: a worker process, a session, a learner process, 2 epochs (~60 s at load 7)
def test_labswarm_run_trains_through_a_job_of_its_manager(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=3)
    experiment = tmp_path / "three.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(
        root, tmp_path / "store", training={"epochs": 2, "validation": 0.34, "threads": 1})))
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"  # a current directory that holds nothing: the run names its own roots
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LABSWARM_DATA_ROOTS"}
    env.update(COLUMNS="160", LABSWARM_HOME=str(home))
    result = subprocess.run([sys.executable, "-m", "labswarm.cli", "run", str(experiment), "--workers", "1",
                             "--no-health"], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    # the session's summary, then the job followed live: its log, a bar per epoch, its metrics, its status
    assert out.index("session") < out.index("learner 0/1 of job") < out.index("COMPLETED")
    assert len(re.findall(r"^epoch 1/2 ━+ \d+/\d+ batches", out, re.M)) == 1
    assert len(re.findall(r"^epoch 2/2  loss", out, re.M)) == 1
    accuracy = re.search(r"accuracy\s*│\s*([0-9.]+)", out).group(1)
    model = Path(re.search(r"model\s*│\s*(\S+)", out).group(1))
    server = EmbeddedServer(create_app(Settings(home=home, data_roots=[str(tmp_path)]))).start()
    try:
        with httpx.Client(base_url=server.url) as http:
            jobs = http.get("/v1/jobs").json()
            assert jobs["total"] == 1 and jobs["jobs"][0]["status"] == "completed"
            metrics = http.get(f"/v1/jobs/{jobs['jobs'][0]['id']}/metrics").json()["metrics"]
    finally:
        server.stop()
    assert [m["epoch"] for m in metrics] == [1, 2] and accuracy == f"{metrics[-1]['val_accuracy']:.3f}"
    assert model == tmp_path / "results" / "jobs" / jobs["jobs"][0]["id"] / "model" / "model.pt" and model.is_file()
