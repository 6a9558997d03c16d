"""``labswarm sessions ...`` through typer's CliRunner against a real manager (embedded, over HTTP) running a
real session of a small tone dataset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import experiment_dict, write_dataset
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.client import ManagerClient
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

TOKEN = "s3cret-token"


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("LABSWARM_API_TOKEN", raising=False)
    monkeypatch.delenv("LABSWARM_MANAGER_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A manager (API token set) running a session of the tone experiment; ``(url, session id)``.

    No worker runs and the rate is low: the session stays running, with nothing done, for the whole test.
    """
    dataset = write_dataset(tmp_path / "data", n_per_label=2)
    with EmbeddedServer(create_app(Settings(home=tmp_path / "home", api_token=TOKEN))) as server, \
            ManagerClient(server.url, TOKEN) as client:
        client.post_experiment(experiment_dict(dataset, tmp_path / "store"))
        session = client.start_session("tones", 0.01)
        yield server.url, session["id"]


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def rows(output: str) -> dict[str, str]:
    """The label -> value rows of a two-column rich table."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 4:
            out[cells[1]] = cells[2]
    return out


def test_list_shows_the_session_with_the_summary_columns(runner: CliRunner, manager, token_file: Path) -> None:
    url, session_id = manager
    result = runner.invoke(app, ["sessions", "list", "--manager", url, "--token-file", str(token_file)])
    assert result.exit_code == 0, result.output
    for column in ("id", "experiment", "owner", "status", "total", "done", "cached", "failed", "republished",
                   "done/s"):
        assert column in result.output
    line = next(line for line in result.output.splitlines() if session_id in line)
    assert "tones" in line and " admin " in line and "running" in line and " 8 " in line  # LABSWARM_API_TOKEN


def test_list_json_parses_and_takes_the_manager_from_the_environment(runner: CliRunner, manager,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    url, session_id = manager
    monkeypatch.setenv("LABSWARM_MANAGER_URL", url)
    monkeypatch.setenv("LABSWARM_API_TOKEN", TOKEN)  # reads need the token too
    result = runner.invoke(app, ["sessions", "list", "--json"])
    assert result.exit_code == 0, result.output
    sessions = json.loads(result.stdout)
    assert [s["id"] for s in sessions] == [session_id] and sessions[0]["total"] == 8


def test_show_prints_the_run_summary_rows_and_details(runner: CliRunner, manager,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url, session_id = manager
    monkeypatch.setenv("LABSWARM_API_TOKEN", TOKEN)  # reads need the token too
    result = runner.invoke(app, ["sessions", "show", session_id, "--manager", url])
    assert result.exit_code == 0, result.output
    assert f"tones: session {session_id} running in" in result.output
    table = rows(result.output)
    assert table["total"] == "8" and table["done"] == "0" and table["failed"] == "0"
    assert table["rate (tasks/s)"] == "0.01" and table["launcher"] == "none"
    shown = json.loads(runner.invoke(app, ["sessions", "show", session_id, "--manager", url, "--json"]).stdout)
    assert shown["id"] == session_id and shown["failures"] == []


def test_pause_resume_rate_and_weight_change_the_session(runner: CliRunner, manager, token_file: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    url, session_id = manager
    common = ["--manager", url, "--token-file", str(token_file), "--json"]

    def run(command: str, *args: str) -> dict:
        result = runner.invoke(app, ["sessions", command, session_id, *args, *common])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    assert run("pause")["status"] == "paused"
    assert run("resume")["status"] == "running"
    assert run("rate", "5")["rate"] == pytest.approx(5.0)
    assert run("weight", "3")["weight"] == pytest.approx(3.0)
    # the token from the environment works as well as from a file
    monkeypatch.setenv("LABSWARM_API_TOKEN", TOKEN)
    result = runner.invoke(app, ["sessions", "pause", session_id, "--manager", url])
    assert result.exit_code == 0, result.output
    assert rows(result.output)["total"] == "8" and f"session {session_id} paused" in result.output
    assert run("cancel")["status"] == "cancelled"


def test_without_the_token_a_change_is_refused_with_exit_code_2(runner: CliRunner, manager) -> None:
    url, session_id = manager
    result = runner.invoke(app, ["sessions", "pause", session_id, "--manager", url])
    assert result.exit_code == 2  # usage: a request the manager refuses as such (labswarm/cli/exits.py)
    assert "401" in result.stderr and "API token" in result.stderr
    result = runner.invoke(app, ["sessions", "list", "--manager", url])  # a read as well
    assert result.exit_code == 2 and "401" in result.stderr


def test_unknown_session_is_a_clear_error_with_exit_code_2(runner: CliRunner, manager, token_file: Path) -> None:
    url, _ = manager
    for command in (["show", "nosuchsession"], ["rate", "nosuchsession", "3"], ["workers", "nosuchsession", "2"]):
        result = runner.invoke(app, ["sessions", *command, "--manager", url, "--token-file", str(token_file)])
        assert result.exit_code == 2, result.output
        assert "404" in result.stderr and "no session 'nosuchsession'" in result.stderr
        assert result.stdout == ""


def test_workers_of_a_session_without_launcher_are_refused(runner: CliRunner, manager, token_file: Path) -> None:
    url, session_id = manager
    result = runner.invoke(app, ["sessions", "workers", session_id, "2", "--manager", url,
                                 "--token-file", str(token_file)])
    assert result.exit_code == 2 and "409" in result.stderr and "no launcher" in result.stderr


def test_bad_values_are_refused_before_any_request(runner: CliRunner) -> None:
    result = runner.invoke(app, ["sessions", "rate", "abc", "0", "--manager", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "RATE" in result.output
    result = runner.invoke(app, ["sessions", "list", "--manager", "http://127.0.0.1:9"])
    assert result.exit_code == 3 and "cannot reach the manager" in result.stderr  # infrastructure


def test_a_unique_prefix_names_the_session_and_lists_keep_ids_whole(runner: CliRunner, manager, token_file: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    url, session_id = manager
    common = ["--manager", url, "--token-file", str(token_file)]
    shown = runner.invoke(app, ["sessions", "show", session_id[:4], *common, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["id"] == session_id
    paused = runner.invoke(app, ["sessions", "pause", session_id[:6], *common, "--json"])
    assert paused.exit_code == 0 and json.loads(paused.stdout)["status"] == "paused"
    other = next(c for c in "0123456789abcdef" if not session_id.startswith(c))
    unknown = runner.invoke(app, ["sessions", "show", other, *common])
    assert unknown.exit_code == 2 and f"no session whose id starts with '{other}'" in unknown.stderr
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal: the other columns give way, not the id
    listed = runner.invoke(app, ["sessions", "list", *common])
    assert listed.exit_code == 0 and session_id in listed.output, listed.output


def test_an_ambiguous_prefix_is_answered_with_the_candidates(runner: CliRunner,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ["ab12cd34ef56", "ab99cd34ef56", "ff12cd34ef56"]
    monkeypatch.setattr(ManagerClient, "sessions", lambda self, limit=None, offset=0: [{"id": i} for i in ids])
    result = runner.invoke(app, ["sessions", "show", "ab", "--manager", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "'ab' is the start of 2 session ids: ab12cd34ef56, ab99cd34ef56" in result.stderr
