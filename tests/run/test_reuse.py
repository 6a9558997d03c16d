"""A second run is cheap (issue 29, item 4): ``labswarm run`` does not train again when a completed job has the
same configuration, data and code; it names that job and shows its result. ``--retrain`` trains, and so does a
changed configuration. The console script against its embedded manager; the jobs are counted by a manager opened
on the same home afterwards (no timing is asserted).

The commands run a copy of the labswarm package taken when the test starts (``PYTHONPATH``, and a current folder
without the source tree, which ``python -m`` would put first): the code version hashes the package's sources, and
the shared working tree this runs in may be edited meanwhile."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes

import labswarm
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


@pytest.fixture(scope="module")
def frozen(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder holding a copy of the labswarm package, for ``PYTHONPATH`` (see the module)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(Path(labswarm.__file__).parent, src / "labswarm", ignore=shutil.ignore_patterns("__pycache__"))
    return str(src)


def _run(experiment: Path, home: Path, frozen: str, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "LABSWARM_DATA_ROOTS"}
    env.update(COLUMNS="160", LABSWARM_HOME=str(home), PYTHONPATH=frozen)
    result = subprocess.run([sys.executable, "-m", "labswarm.cli", "run", str(experiment), "--workers", "1",
                             "--no-health", *extra], env=env, cwd=experiment.parent, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _jobs(home: Path, roots: Path) -> list[dict]:
    server = EmbeddedServer(create_app(Settings(home=home, data_roots=[str(roots)]))).start()
    try:
        with httpx.Client(base_url=server.url) as http:
            return http.get("/v1/jobs").json()["jobs"]
    finally:
        server.stop()


@pytest.mark.slow  # three trainings of one epoch and a reused one (~2-3 min at load 7)
def test_a_second_identical_run_reuses_the_completed_job_and_retrain_or_a_change_trains(tmp_path: Path,
                                                                                         frozen: str) -> None:
    root = write_three_classes(tmp_path / "data", per_class=3)
    experiment = tmp_path / "three.yml"
    data = training_experiment(root, tmp_path / "store", training={"epochs": 1, "validation": 0.34, "threads": 1})
    experiment.write_text(yaml.safe_dump(data))
    home = tmp_path / "home"

    first = _run(experiment, home, frozen)
    assert "training reused" not in first and "learner 0/1 of job" in first
    [job] = _jobs(home, tmp_path)
    assert job["status"] == "completed"

    second = _run(experiment, home, frozen)
    assert f"training reused: job {job['id']}" in second and "--retrain" in second
    assert "learner 0/1 of job" not in second  # nothing followed: nothing trained
    assert [j["id"] for j in _jobs(home, tmp_path)] == [job["id"]]
    # its result is shown as the first run showed it
    accuracy = re.compile(r"accuracy\s*│\s*([0-9.]+)")
    assert accuracy.search(second).group(1) == accuracy.search(first).group(1)
    assert re.search(rf"job\s*│\s*{job['id']}", second)

    third = _run(experiment, home, frozen, "--retrain")
    assert "training reused" not in third
    jobs = _jobs(home, tmp_path)
    assert len(jobs) == 2 and all(j["status"] == "completed" for j in jobs)

    data["training"]["learning_rate"] = 0.02  # another configuration
    experiment.write_text(yaml.safe_dump(data))
    fourth = _run(experiment, home, frozen)
    assert "training reused" not in fourth
    assert len(_jobs(home, tmp_path)) == 3


def _train(experiment: Path, home: Path, frozen: str, *extra: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "LABSWARM_HOME": str(home), "PYTHONPATH": frozen}
    result = subprocess.run([sys.executable, "-m", "labswarm.cli", "train", str(experiment), "--no-compute", *extra],
                            env=env, cwd=experiment.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _metrics_lines(home: Path) -> list[str]:
    [metrics] = home.glob("train/three-*/metrics.jsonl")
    return metrics.read_text().splitlines()


@pytest.mark.slow  # three trainings of one epoch in-process, and a reused one
def test_labswarm_train_reuses_its_completed_model_until_retrain_or_the_data_changes(tmp_path: Path,
                                                                                      frozen: str) -> None:
    root = write_three_classes(tmp_path / "data", per_class=3)
    experiment = tmp_path / "three.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(
        root, tmp_path / "store", training={"epochs": 1, "validation": 0.34, "threads": 1})))
    home = tmp_path / "home"

    first = _train(experiment, home, frozen)
    assert "training reused" not in first
    [model] = (home / "models").glob("three-*.pt")
    trained = model.stat().st_mtime_ns
    lines = _metrics_lines(home)

    second = _train(experiment, home, frozen)
    assert f"training reused: model {model}" in second and "--retrain" in second
    assert "training cnn" not in second  # the trainer never started
    assert model.stat().st_mtime_ns == trained and _metrics_lines(home) == lines
    accuracy = re.compile(r"accuracy\s*│\s*([0-9.]+)")
    assert accuracy.search(second).group(1) == accuracy.search(first).group(1)

    third = _train(experiment, home, frozen, "--retrain")
    assert "training reused" not in third and "training cnn" in third
    assert model.stat().st_mtime_ns != trained
    retrained = model.stat().st_mtime_ns

    wav = root / "low" / "low_0.wav"  # the same bytes written again: the data counts as changed
    wav.write_bytes(wav.read_bytes())
    os.utime(wav, ns=(wav.stat().st_atime_ns, wav.stat().st_mtime_ns + 1_000_000_000))
    fourth = _train(experiment, home, frozen)
    assert "training reused" not in fourth and model.stat().st_mtime_ns != retrained
