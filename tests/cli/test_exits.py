"""Issue 29: errors before work, exit codes with a meaning, output for logs; through typer's CliRunner (whose
output is not a terminal, as in a log)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import experiment_dict, write_dataset
from rich.table import Table
from typer.testing import CliRunner

import labswarm.run
from labswarm.cli import exits
from labswarm.cli.main import app
from labswarm.cli.output import LogConsole
from labswarm.cli.progress import Phase
from labswarm.config.experiment import parse_experiment
from labswarm.errors import (
    AudioError,
    BrokerError,
    ConfigError,
    DatasetError,
    LabswarmError,
    ManagerError,
    NotFound,
    StorageError,
)
from labswarm.run import RunResult


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.delenv("COLUMNS", raising=False)  # the width of a log: not set
    monkeypatch.setenv("LABSWARM_HOME", str(tmp_path / "home"))
    return CliRunner()


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The runs ``labswarm run`` started (``labswarm.run.run_experiment`` replaced: nothing really starts)."""
    calls: list[Any] = []

    def run_experiment(config: Any, options: Any, **kwargs: Any) -> RunResult:
        calls.append(options)
        raise ManagerError("cannot reach the manager at http://127.0.0.1:9: refused")

    monkeypatch.setattr(labswarm.run, "run_experiment", run_experiment)
    return calls


def write_experiment(tmp_path: Path, **changes: Any) -> Path:
    dataset = tmp_path / "data"
    if not dataset.exists():
        write_dataset(dataset, n_per_label=2)
    data = experiment_dict(dataset, tmp_path / "store")
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    path = tmp_path / "e.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_missing_labels_file_is_an_error_before_any_manager_starts(runner: CliRunner, tmp_path: Path,
                                                                      started: list[Any]) -> None:
    path = write_experiment(tmp_path, dataset__labels="nolabels.csv")
    for command in (["run", str(path)], ["train", str(path)], ["features", str(path)]):
        result = runner.invoke(app, command)
        assert result.exit_code == exits.USAGE, (command, result.output)
        assert "dataset.labels: no such file" in result.stderr and "nolabels.csv" in result.stderr
        assert "HTTP" not in result.output and "dashboard" not in result.output and "0/?" not in result.output
    assert started == []  # no manager, no worker


def test_missing_audio_files_and_folders_are_named_before_work(runner: CliRunner, tmp_path: Path,
                                                               started: list[Any]) -> None:
    path = write_experiment(tmp_path)
    (tmp_path / "data" / "low" / "low_1.wav").unlink()
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == exits.USAGE
    assert "line 3: no such audio file" in result.stderr and "low_1.wav" in result.stderr
    path = write_experiment(tmp_path, dataset__root=str(tmp_path / "nodata"))
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == exits.USAGE and "dataset.root: no such folder" in result.stderr
    assert started == []


def test_a_remote_manager_checks_the_files_itself_and_an_unreachable_one_is_infrastructure(
        runner: CliRunner, tmp_path: Path, started: list[Any]) -> None:
    path = write_experiment(tmp_path, dataset__labels="on-the-cluster.csv")  # may exist on the cluster only
    result = runner.invoke(app, ["run", str(path), "--manager", "http://127.0.0.1:9"])
    assert len(started) == 1 and result.exit_code == exits.INFRASTRUCTURE
    assert "cannot reach the manager" in result.stderr


def test_a_misspelled_key_suggests_the_known_one() -> None:
    data = experiment_dict(Path("/d"), Path("/s"))
    data["dataset"]["smaple_rate"] = 16000
    data["datset"] = data.pop("dataset")
    data["transformations"][1]["gain_bd"] = 3.0
    with pytest.raises(ConfigError) as raised:
        parse_experiment(data)
    errors = dict(raised.value.errors)
    assert errors["datset"].startswith("unknown key 'datset': did you mean 'dataset'? (known: name, description")
    assert "dataset" not in errors  # its "Field required" is the same mistake
    assert errors["transformations.1.gain_bd"].startswith("unknown key 'gain_bd': did you mean 'gain_db'?")
    data["dataset"] = data.pop("datset")
    with pytest.raises(ConfigError) as raised:
        parse_experiment(data)
    assert dict(raised.value.errors)["dataset.smaple_rate"].startswith(
        "unknown key 'smaple_rate': did you mean 'sample_rate'? (known: root, labels, sample_rate, segment)")
    data["dataset"].pop("smaple_rate")
    data["colour"] = "blue"
    with pytest.raises(ConfigError) as raised:
        parse_experiment(data)
    assert dict(raised.value.errors)["colour"].startswith("unknown key 'colour' (known: name,")  # nothing close


def _result(status: str, failed: int, total: int = 8) -> RunResult:
    progress = {"id": "0123456789abcdef", "experiment": "tones", "status": status, "total": total,
                "done": total - failed, "cached": 0, "failed": failed, "republished": 0, "samples_per_s": 2.0,
                "finished": total, "error": "the launcher failed" if status == "failed" else None}
    failures = [{"sample_id": f"low/low_0.wav#{i}", "reason": "AudioError: corrupt"} for i in range(failed)]
    return RunResult(progress, failures, 1.0)


@pytest.mark.parametrize(("status", "failed", "code"), [
    ("completed", 0, exits.OK), ("completed", 2, exits.FAILED), ("cancelled", 0, exits.FAILED),
    ("failed", 0, exits.INFRASTRUCTURE)])
def test_run_exit_status_says_how_the_session_ended(runner: CliRunner, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, status: str, failed: int,
                                                    code: int) -> None:
    def run_experiment(config: Any, options: Any, *, settings: Any, hooks: Any) -> RunResult:
        result = _result(status, failed)
        hooks.on_progress(result.progress)
        hooks.on_session_end(result)
        return result

    monkeypatch.setattr(labswarm.run, "run_experiment", run_experiment)
    result = runner.invoke(app, ["run", str(write_experiment(tmp_path)), "--no-train"])
    assert result.exit_code == code, result.output
    if failed:
        assert "2 of 8 samples failed" in result.stderr and "low/low_0.wav#1: AudioError: corrupt" in result.stdout
    if status == "failed":
        assert "the launcher failed" in result.stderr
    assert "features tones: 8/8 (100.0%)" in result.stdout and "session 0123456789abcdef" in result.stdout


def test_features_exits_1_when_some_samples_failed_and_prints_plain_progress(runner: CliRunner,
                                                                            tmp_path: Path) -> None:
    path = write_experiment(tmp_path, transformations=[{"name": "identity"}])
    (tmp_path / "data" / "low" / "low_0.wav").write_bytes(b"RIFF not a wav")
    result = runner.invoke(app, ["features", str(path), "--jobs", "1"])
    assert result.exit_code == exits.FAILED, result.output
    assert "features tones: 4/4 (100.0%)" in result.stdout and "1 failed" in result.stdout
    assert "━" not in result.stdout  # no bar in a log


@pytest.mark.parametrize(("error", "code"), [
    (ConfigError("x"), exits.USAGE), (DatasetError("x"), exits.USAGE), (NotFound("x"), exits.USAGE),
    (ManagerError("x", status=422), exits.USAGE), (ManagerError("x", status=401), exits.USAGE),
    (ManagerError("x", status=None), exits.INFRASTRUCTURE), (ManagerError("x", status=502), exits.INFRASTRUCTURE),
    (BrokerError("x"), exits.INFRASTRUCTURE), (StorageError("x"), exits.INFRASTRUCTURE),
    (AudioError("a.wav", "corrupt"), exits.FAILED), (LabswarmError("x"), exits.FAILED)])
def test_each_kind_of_error_has_its_exit_status(error: LabswarmError, code: int) -> None:
    assert exits.exit_code(error) == code


def test_phase_prints_a_plain_line_every_few_seconds_and_at_the_end() -> None:
    console = LogConsole(record=True, file=open("/dev/null", "w"))  # noqa: SIM115 (closed with the console)
    now = [0.0]
    with Phase("features tones", console, every=5.0, clock=lambda: now[0]) as phase:
        for done in range(1, 11):
            now[0] = done * 1.0
            phase.update(done * 10, 100, failed=done // 5)
    console.file.close()
    lines = console.export_text().splitlines()
    assert lines == ["features tones: 50/100 (50.0%), 10.0 samples/s, 1 failed, elapsed 5s, ETA 5s",
                     "features tones: 100/100 (100.0%), 10.0 samples/s, 2 failed, elapsed 10s"]


def test_a_table_in_a_log_is_not_cut_to_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = LogConsole(record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    table = Table("id", "model")
    table.add_row("b45719c6ac0f4f2e9d1c3a5b7e9f1d3c", "/a/very/long/path/" * 8 + "model.pt")
    console.print(table)
    console.file.close()
    text = console.export_text()
    assert "b45719c6ac0f4f2e9d1c3a5b7e9f1d3c" in text and "/a/very/long/path/" * 8 + "model.pt" in text
    assert "…" not in text
