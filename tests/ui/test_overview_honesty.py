"""What the overview and the session page claim (issue 27, item 5), read as the server renders them over real HTTP
from a real manager (embedded broker, sessions without workers): totals that cover only the active sessions say
so, a worker or consumer count nobody knows is "unknown" (never 0), every measured rate says its window."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import experiment_dict, write_dataset
from jobs.manager import manager


def _card(page: str, ident: str) -> str:
    match = re.search(rf'<b id="{ident}"[^>]*>([^<]*)</b><span>([^<]*)</span>', page)
    assert match, ident
    return f"{match[1].strip()} | {match[2]}"


def test_totals_name_what_they_cover_and_unknown_counts_are_unknown(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", n_per_label=2)
    with manager(tmp_path) as m:
        http = m.http
        page = http.get("/ui/").text
        assert _card(page, "t-workers") == "0 | workers (launchers, active sessions)"  # no session: none running
        for name in ("ours", "theirs"):
            assert http.post("/experiments", json=experiment_dict(data, tmp_path / "store", name=name)).is_success
        # a session whose workers someone else started (launcher none): their number is not known
        theirs = http.post("/experiments/theirs/sessions", json={"rate": 0.5}).json()["id"]
        page = http.get("/ui/").text
        assert _card(page, "t-workers") == "unknown | workers (launchers, active sessions)"
        assert _card(page, "t-consumers") == "unknown | consumers (broker, active sessions)"  # embedded broker
        assert _card(page, "t-done").endswith("| samples done (active sessions)")
        assert _card(page, "t-failed").endswith("| failed (active sessions)")
        assert _card(page, "t-depth").endswith("| waiting, queued or in work (active sessions)")
        assert _card(page, "t-done-per-s").endswith("| done/s since start (active sessions)")
        assert "<th class=\"n\">done/s since start</th>" in page and "<th class=\"n\">rate asked /s</th>" in page
        # beside it, one the manager's launcher runs (no worker yet): the known count and the unknown one
        ours = http.post("/experiments/ours/sessions", json={"rate": 0.5, "launcher": "local", "workers": 0})
        assert ours.status_code == 201, ours.text
        page = http.get("/ui/partials/overview").text
        assert _card(page, "t-workers") == "0 + unknown | workers (launchers, active sessions)"
        rows = {sid: re.search(rf'<tr data-session="{sid}">.*?</tr>', page.split('id="workers"')[1], re.S)[0]
                for sid in (theirs, ours.json()["id"])}
        assert "<td class=\"n\" data-workers>unknown</td>" in rows[theirs]
        assert "<td class=\"n\" data-workers>0</td>" in rows[ours.json()["id"]]
        session = http.get(f"/ui/sessions/{theirs}").text
        assert _card(session, "v-workers") == "unknown | workers (none launcher)"
        assert _card(session, "v-consumers") == "unknown | consumers (broker)"
        assert _card(session, "v-publish") == "– | publish /s, last 5 s"
        assert _card(session, "v-consume") == "– | consume /s, last 5 s"
        assert _card(session, "v-done-rate").endswith("| done /s since start")
        for sid in (theirs, ours.json()["id"]):
            http.post(f"/sessions/{sid}/cancel")
