"""`labswarm run`'s dashboard can be opened while the run lasts: the embedded manager's token of this run is in a
file of the user's only (0600) under the run's home, named with the dashboard's URL, never printed; the login at
that URL works with it over real HTTP; the file is gone when the run ends. A token of the user's own is in no file
the run writes (everything it writes is under the test's folder: its home, store and logs) and in none of its
output or log records."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import httpx
import pytest
from helpers import experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.run import RunHooks, RunOptions, dashboard_line, run_experiment, write_private
from labswarm.settings import Settings


class Seen(Exception):
    """Ends the run once the dashboard was checked (no workers are needed for that)."""


def _run(tmp_path: Path, tone_dataset: Path, check, **settings) -> None:
    config = parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))
    with pytest.raises(Seen):
        run_experiment(config, RunOptions(workers=0, launcher="none", health=False), hooks=_Hooks(check),
                       settings=Settings(home=tmp_path / "home", data_roots=[tmp_path], **settings))


class _Hooks(RunHooks):
    """The run's dashboard goes to ``check``."""

    def __init__(self, check) -> None:
        self.check = check

    def on_dashboard(self, url: str, token_file: Path | None) -> None:
        self.check(url, token_file)


def _holding(root: Path, token: str) -> list[Path]:
    """The files under ``root`` whose bytes hold ``token`` (the manager's database and its journal included)."""
    needle = token.encode()
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes())


def _printed(token: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> list[str]:
    """Where ``token`` shows in what the run printed (stdout, stderr) and logged. The records of httpx and httpcore
    are the test's own client: at DEBUG they show the login's ``Set-Cookie``, and the dashboard's cookie is the token
    by design (labswarm.auth.cookie)."""
    out, err = capfd.readouterr()
    ours = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    return ([name for name, text in (("stdout", out), ("stderr", err)) if token in text]
            + [f"log record {r.name}: {r.getMessage()}" for r in ours if token in r.getMessage()])


def test_the_dashboard_opens_with_the_token_of_a_private_file_while_the_run_lasts(
        tmp_path: Path, tone_dataset: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("LABSWARM_API_TOKEN", raising=False)
    caplog.set_level(logging.DEBUG)
    seen: dict = {}

    def check(url: str, token_file: Path | None) -> None:
        seen.update(url=url, file=token_file)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/ui")
        assert token_file is not None and token_file.parent == tmp_path / "home"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = seen["token"] = token_file.read_text()
        line = dashboard_line(url, token_file)  # what `labswarm run` prints
        assert line == f"dashboard: {url} (token in {token_file})" and token not in line
        with httpx.Client(base_url=url.removesuffix("/ui"), timeout=20.0) as http:
            assert http.get("/ui/").status_code == 401  # not logged in: the login form, no data
            assert http.get("/sessions").status_code == 401
            assert http.post("/ui/login", data={"token": token[::-1], "next": "/ui/"}).status_code == 401
            login = http.post("/ui/login", data={"token": token, "next": "/ui/"})
            assert login.status_code == 303, login.text
            overview = http.get(login.headers["location"])  # the cookie the login set
            assert overview.status_code == 200 and "login" not in overview.url.path, overview.text[:300]
        raise Seen

    _run(tmp_path, tone_dataset, check)
    assert seen["file"] is not None and not seen["file"].exists()  # removed with the manager
    assert _printed(seen["token"], capfd, caplog) == []  # never printed nor logged


def test_a_token_of_the_users_own_is_in_no_file_of_the_run_and_in_none_of_its_output(
        tmp_path: Path, tone_dataset: Path, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    token = "the-users-own-token-for-this-test"
    caplog.set_level(logging.DEBUG)
    seen: dict = {}

    def check(url: str, token_file: Path | None) -> None:
        seen.update(url=url, file=token_file, holding=_holding(tmp_path, token))  # while the run lasts
        raise Seen

    _run(tmp_path, tone_dataset, check, api_token=token)
    assert seen["file"] is None and not list((tmp_path / "home").glob("dashboard-*"))
    assert (tmp_path / "home").is_dir() and seen["holding"] == [] and _holding(tmp_path, token) == []
    assert _printed(token, capfd, caplog) == []


def test_a_private_file_is_0600_whatever_the_umask_and_replaces_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("kept")
    (tmp_path / "t").symlink_to(elsewhere)
    old = os.umask(0o277)  # would make it 0400
    try:
        write_private(tmp_path / "t", "secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "t").lstat().st_mode) == 0o600 and not (tmp_path / "t").is_symlink()
    assert (tmp_path / "t").read_text() == "secret" and elsewhere.read_text() == "kept"
