"""`labswarm train` through the real console script: killed mid-epoch, then `--resume`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from three_classes import training_experiment, write_three_classes

EPOCHS = 4  # killed in epoch 2, resumed for 2-4: each epoch after the kill is the same scenario again


def _command(experiment: Path, home: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "COLUMNS": "200", "LABSWARM_HOME": str(home)}
    return [sys.executable, "-m", "labswarm.cli", "train", str(experiment), "--no-compute", *args], env


def _epochs(metrics: Path) -> list[int]:
    if not metrics.is_file():
        return []
    return [json.loads(line)["epoch"] for line in metrics.read_text().splitlines() if line.strip()]


def test_killed_mid_epoch_then_resume_ends_with_every_epoch_once(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=10)
    data = training_experiment(root, tmp_path / "store", training={"epochs": EPOCHS, "learning_rate": 0.003,
                                                                    "validation": 0.25, "threads": 1})
    experiment = tmp_path / "three.yml"
    experiment.write_text(yaml.safe_dump(data))
    home = tmp_path / "home"
    cmd, env = _command(experiment, home)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    metrics = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(home.glob("train/*/checkpoint.pt"))  # written after the epoch's metrics line
        if found:
            metrics = found[0].parent / "metrics.jsonl"
            break
        time.sleep(0.02)
    assert metrics is not None, "no epoch finished in time"
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its producers, mid-epoch 2
    proc.communicate(timeout=30)
    killed_at = _epochs(metrics)
    assert proc.returncode == -signal.SIGKILL and len(killed_at) < EPOCHS, "the run ended before the kill"

    cmd, env = _command(experiment, home, "--resume")
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed after" in resumed.stdout
    assert _epochs(metrics) == list(range(1, EPOCHS + 1))  # no gap, no repeat
    models = list((home / "models").glob("three-*.pt"))
    assert len(models) == 1


def test_train_computes_missing_features_through_a_session_first(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=6)
    data = training_experiment(root, tmp_path / "store", training={"epochs": 2, "validation": 0.25, "threads": 1})
    data["pipeline"][2] = {"name": "features", "compute_missing": False}  # training itself computes nothing
    experiment = tmp_path / "three.yml"
    experiment.write_text(yaml.safe_dump(data))
    cmd, env = _command(experiment, tmp_path / "home", "--compute", "--workers", "1")
    cmd.remove("--no-compute")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "completed" in result.stdout and "held-out accuracy" in result.stdout
    assert len(list((tmp_path / "store").rglob("*.npy"))) == 3 * 6 * 2 * 2  # samples × (mel, mfcc)
