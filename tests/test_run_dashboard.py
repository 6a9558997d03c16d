"""`labswarm run`'s dashboard can be opened while the run lasts: the embedded manager's token of this run is in a
file of the user's only (0600) under the run's home, named with the dashboard's URL, never printed; the login at
that URL works with it over real HTTP; the file is gone when the run ends. A token of the user's own is not
written anywhere."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
from helpers import experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.run import dashboard_line, run_experiment, write_private
from labswarm.settings import Settings


class Seen(Exception):
    """Ends the run once the dashboard was checked (no workers are needed for that)."""


def _run(tmp_path: Path, tone_dataset: Path, check, **settings) -> None:
    config = parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))
    with pytest.raises(Seen):
        run_experiment(config, workers=0, launcher="none", health=False, on_dashboard=check,
                       settings=Settings(home=tmp_path / "home", data_roots=[tmp_path], **settings))


def test_the_dashboard_opens_with_the_token_of_a_private_file_while_the_run_lasts(
        tmp_path: Path, tone_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABSWARM_API_TOKEN", raising=False)
    seen: dict = {}

    def check(url: str, token_file: Path | None) -> None:
        seen.update(url=url, file=token_file)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/ui")
        assert token_file is not None and token_file.parent == tmp_path / "home"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text()
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


def test_a_token_of_the_users_own_is_written_nowhere(tmp_path: Path, tone_dataset: Path) -> None:
    seen: dict = {}

    def check(url: str, token_file: Path | None) -> None:
        seen.update(url=url, file=token_file)
        raise Seen

    _run(tmp_path, tone_dataset, check, api_token="the-users-own-token-for-this-test")
    assert seen["file"] is None and not list((tmp_path / "home").glob("dashboard-*"))


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
