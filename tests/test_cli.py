"""End to end through the real console script: a small demo set, then `labswarm features` twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labswarm.datasets.demo import missing_packages

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def labswarm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "labswarm.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if missing_packages() and os.environ.get("CI") != "true":
        pytest.skip(f"Debian packages missing: {missing_packages()}")
    out = tmp_path_factory.mktemp("demo")
    result = labswarm("demo-data", str(out), "--per-class", "2", "--jobs", "2", cwd=out)
    assert result.returncode == 0, result.stderr
    return out


def test_demo_data_is_reused_when_identical(demo_dir: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in demo_dir.rglob("*.wav")}
    result = labswarm("demo-data", str(demo_dir), "--per-class", "2", cwd=demo_dir)
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
    assert "computed" in first.stdout and " 24 " in first.stdout  # 6 clips x 4 transformations
    second = labswarm("features", str(path), "--jobs", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip()
             for line in second.stdout.splitlines() if line.count("│") >= 3}
    assert lines["computed"] == "0" and lines["cached"] == "24" and lines["failed"] == "0"


def test_invalid_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("name: x\ndataset: {root: .}\nfeatures: [{name: mel, n_mels: -3}]\nstore: {root: s}\n")
    result = labswarm("features", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "features.0.n_mels" in result.stderr
    assert not (tmp_path / "s").exists()
