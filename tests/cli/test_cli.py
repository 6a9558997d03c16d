"""End to end through the real console script: a small demo set, then `labswarm features` twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def labswarm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "labswarm.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def demo_dir(demo_set: Path) -> Path:
    """The shared demo set (tests/conftest.py): 3 clips per class, seed 0, built by ``labswarm demo-data``."""
    return demo_set


def test_demo_data_is_reused_when_identical(demo_dir: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in demo_dir.rglob("*.wav")}
    result = labswarm("demo-data", str(demo_dir), "--per-class", "3", cwd=demo_dir)
    assert result.returncode == 0 and "already built" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in demo_dir.rglob("*.wav")} == before


def test_features_twice_second_run_all_cached(demo_dir: Path, tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "examples" / "music_speech_noise.yml").read_text())
    config["dataset"]["root"] = str(demo_dir)
    config["store"]["root"] = str(tmp_path / "store")
    config["transformations"] = config["transformations"][:4]  # identity, two pitch shifts, one EQ: fast
    path = tmp_path / "e.yml"
    path.write_text(yaml.safe_dump(config))
    first = labswarm("features", str(path), "--jobs", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "computed" in first.stdout and " 36 " in first.stdout  # 9 clips x 4 transformations
    second = labswarm("features", str(path), "--jobs", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip()
             for line in second.stdout.splitlines() if line.count("│") >= 3}
    assert lines["computed"] == "0" and lines["cached"] == "36" and lines["failed"] == "0"


def test_invalid_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("name: x\ndataset: {root: .}\nfeatures: [{name: mel, n_mels: -3}]\nstore: {root: s}\n")
    result = labswarm("features", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "features.0.n_mels" in result.stderr
    assert not (tmp_path / "s").exists()
