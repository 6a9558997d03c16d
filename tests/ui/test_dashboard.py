"""The dashboard end to end: headless Chromium (Debian's ``chromium``, driven by Playwright) against a real manager
served over HTTP on loopback with an API token, a real session publishing to the embedded broker, and real
training jobs (learner processes).

The session has no Celery workers: the test reports the outcomes of published samples itself, over HTTP, as a
worker does (``POST /sessions/{id}/outcomes``), so the figure's numbers are known. Every page is checked for
console errors and uncaught exceptions. With ``LABSWARM_UI_SCREENSHOTS=DIR`` the pages are also saved as
``DIR/ui-{overview,session,job,compare}.png`` (how the README's pictures in ``docs/`` are made). One browser and
one manager serve the whole module (a browser context per test): their start-up is most of a test's cost.

Without Chromium or Playwright the tests skip locally and fail in CI (``CI=true``): ``.ci/setup`` installs both.
"""

from __future__ import annotations

import contextlib
import os
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import experiment_dict, write_dataset
from jobs.manager import Manager, manager, wait_until
from jobs.tiny import tiny_manifest

from labswarm.sessions import ledger
from ui.compare_files import write_compare

#: The browser: Debian's package (never a download).
CHROMIUM = "/usr/bin/chromium"
#: What Chromium needs here (RUNBOOK, browser section): as root, on a machine with no network beyond loopback.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
#: The manager's API token.
TOKEN = "ui-test-token-0123456789abcdef"
#: Milliseconds any one condition may take to show in the page (learners start in a few seconds; CI is slow).
WAIT_MS = 90_000


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI=true: .ci/setup installs it)")
    pytest.skip(what)


@dataclass
class Served:
    """The manager under test: its URL, a bearer-authenticated client, the folder its files live in."""

    m: Manager
    url: str
    root: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("ui")
    with manager(root, api_token=TOKEN, job_slots=2) as m:  # two jobs at once: the halt test's starts early
        m.http.headers["Authorization"] = f"Bearer {TOKEN}"
        yield Served(m, m.server.url, root)


@pytest.fixture(scope="module")
def long_job(served: Served) -> dict:
    """A job of many epochs, submitted once for the module; the job-page test asks for it so that its learners
    start while that test's job trains (their start-up, ~10-20 s here, is most of a job test's time)."""
    return served.m.submit(tiny_manifest(served.root, epochs=1000, name="long"))


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not Path(CHROMIUM).is_file():
        _missing(f"no {CHROMIUM}: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: pip install -e '.[ui]'")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


class Console:
    """The console errors and uncaught exceptions of a page."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        page.on("console", lambda msg: self.errors.append(f"console: {msg.text} ({msg.location.get('url')})")
                if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"exception: {exc}"))


@pytest.fixture
def page(browser, served: Served) -> Iterator:
    """A page of a fresh browser context logged in through the login page; no console error by the end."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=served.url)
    page = context.new_page()
    console = Console(page)
    page.goto("/ui/login")
    expect(page.locator("#login-form")).to_be_visible()
    page.fill("#token", TOKEN)
    page.click("#login-form button")
    expect(page.locator("h1")).to_have_text("Overview")
    try:
        yield page
        assert console.errors == []
    finally:
        context.close()


def screenshot(page, name: str) -> None:
    """Save the page as ``$LABSWARM_UI_SCREENSHOTS/ui-<name>.png`` when that variable is set."""
    folder = os.environ.get("LABSWARM_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"ui-{name}.png"), full_page=True)


def points(page, figure: str) -> int:
    return int(page.get_attribute(f"#{figure}", "data-points") or 0)


def wait_points(page, figure: str, at_least: int, timeout: float = WAIT_MS) -> None:
    page.wait_for_function(f"n => Number(document.getElementById('{figure}').dataset.points) >= n", arg=at_least,
                           timeout=timeout)


def test_an_unauthenticated_browser_sees_the_login_page_and_no_data(browser, served: Served) -> None:
    from playwright.sync_api import expect

    served.m.http.post("/experiments", json=experiment_dict(write_dataset(served.root / "secret"),
                                                            served.root / "store", name="secret-experiment"))
    context = browser.new_context(base_url=served.url)
    page = context.new_page()
    console = Console(page)
    try:
        for path in ("/ui/jobs/abc", "/ui/sessions/abc", "/ui/partials/overview", "/ui/"):
            response = page.goto(path)
            assert response.status == 401 and response.headers["www-authenticate"] == "Bearer", path
            expect(page.locator("#login-form")).to_be_visible()
            assert page.input_value("input[name=next]") == path
            assert "secret-experiment" not in page.content()
        # the API refuses the browser too (no cookie), and a wrong token is refused by the login page
        assert page.request.get("/experiments").status == 401
        page.fill("#token", "not-the-token")
        page.click("#login-form button")
        expect(page.locator("#login-error")).to_have_text("wrong token")
        assert context.cookies() == []
        page.fill("#token", TOKEN)
        page.click("#login-form button")
        expect(page.locator("h1")).to_have_text("Overview")
        assert page.url == served.url + "/ui/"  # back where the login was asked for
        cookie = next(c for c in context.cookies() if c["name"] == "labswarm_token")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""  # out of the scripts' reach
        # on the cookie, state changes need the dashboard's header (another site's form cannot send it)
        assert page.request.get("/experiments").status == 200
        assert page.request.post("/experiments", data="name: x").status == 401
    finally:
        context.close()
    # the failed login's 401 page load is the only error the browser logged
    assert [e for e in console.errors if "401" not in e] == []


def test_the_session_page_follows_a_running_session_and_its_controls_act(page, served: Served) -> None:
    from playwright.sync_api import expect

    http = served.m.http
    data = write_dataset(served.root / "tones", n_per_label=10)  # 20 clips x 2 transformations: 40 samples
    assert http.post("/experiments", json=experiment_dict(data, served.root / "store", name="ui-tones")).is_success
    session = http.post("/experiments/ui-tones/sessions", json={"rate": 5}).json()
    sid = session["id"]
    page.goto(f"/ui/sessions/{sid}")
    expect(page.locator("#status")).to_have_text("running")
    expect(page.locator("#v-workers")).to_have_text("unknown")  # launcher none: its workers are not the manager's
    expect(page.locator("#v-consumers")).to_have_text("unknown")  # the embedded broker counts no consumer
    wait_points(page, "figure", 2)
    seen = points(page, "figure")
    wait_points(page, "figure", seen + 2)  # the figure gains points while the session runs
    # the publisher fills the start window: the depth shown follows the ledger
    wait_until(lambda: http.get(f"/sessions/{sid}").json()["pending"] >= 6, 30, "6 samples published")

    # a worker's outcomes, over HTTP: 5 done, 1 failed with its reason
    with served.m.jobs.sessions.db() as db:
        published = [sample for sample, _ in ledger.pending(db, sid)][:6]
    outcomes = [{"sample_id": s, "status": "computed", "seconds": 0.01} for s in published[:5]]
    outcomes.append({"sample_id": published[5], "status": "failed", "reason": "AudioError: clip too short (test)"})
    assert http.post(f"/sessions/{sid}/outcomes", json={"outcomes": outcomes}).json()["applied"] == 6
    expect(page.locator("#v-done")).to_have_text("5", timeout=WAIT_MS)
    expect(page.locator("#v-failed")).to_have_text("1")
    expect(page.locator("#failures tbody")).to_contain_text("AudioError: clip too short (test)")
    page.wait_for_function("() => Number(document.getElementById('v-consume').textContent) > 0", timeout=WAIT_MS)
    screenshot(page, "session")

    # the controls: pause, resume, rate, weight, cancel (confirmed)
    page.click("#controls button[data-action=pause]")
    expect(page.locator("#status")).to_have_text("paused", timeout=WAIT_MS)
    assert http.get(f"/sessions/{sid}").json()["status"] == "paused"
    page.click("#controls button[data-action=resume]")
    expect(page.locator("#status")).to_have_text("running", timeout=WAIT_MS)
    page.fill("#controls input[name=rate]", "7.5")
    page.click("#controls form[data-put=rate] button")
    expect(page.locator("#v-rate")).to_have_text("7.5", timeout=WAIT_MS)
    page.fill("#controls input[name=weight]", "3")
    page.click("#controls form[data-put=weight] button")
    expect(page.locator("#v-weight")).to_have_text("3", timeout=WAIT_MS)
    progress = http.get(f"/sessions/{sid}").json()
    assert (progress["rate"], progress["weight"]) == (7.5, 3.0)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#controls button[data-action=cancel]")
    expect(page.locator("#status")).to_have_text("cancelled", timeout=WAIT_MS)
    assert http.get(f"/sessions/{sid}").json()["status"] == "cancelled"
    expect(page.locator("#controls button[data-action=pause]")).to_be_disabled()


def _series(served: Served, sid: str) -> dict:
    return served.m.http.get(f"/sessions/{sid}/series").json()


def test_a_sessions_page_draws_its_whole_history_live_and_once_it_ended(page, served: Served) -> None:
    """Opened while the session runs, the figure starts at the session's start (its history, not the page's
    first second); reloaded after the end, it draws the whole history and its axis spans the session, not years."""
    from playwright.sync_api import expect

    http = served.m.http
    data = write_dataset(served.root / "history", n_per_label=3)  # 12 samples at 2/s, reported a few at a time
    assert http.post("/experiments", json=experiment_dict(data, served.root / "store", name="ui-history")).is_success
    sid = http.post("/experiments/ui-history/sessions", json={"rate": 2}).json()["id"]

    def report(limit: int) -> str:  # outcomes of some published samples, as a worker sends them
        with served.m.jobs.sessions.db() as db:
            published = [sample for sample, _ in ledger.pending(db, sid)][:limit]
        outcomes = [{"sample_id": s, "status": "computed", "seconds": 0.01} for s in published]
        assert http.post(f"/sessions/{sid}/outcomes", json={"outcomes": outcomes}).is_success
        return http.get(f"/sessions/{sid}").json()["status"]

    wait_until(lambda: len(_series(served, sid)["points"]) >= 4, 60, "4 points of history")
    report(2)
    start = _series(served, sid)["start"]
    page.goto(f"/ui/sessions/{sid}")
    expect(page.locator("#series-note")).to_contain_text("history kept by the manager", timeout=WAIT_MS)
    wait_points(page, "figure", 4)
    assert float(page.get_attribute("#figure", "data-from")) == pytest.approx(start)  # from the start on

    wait_until(lambda: report(2) == "completed" or time.sleep(0.7), 120, "the session completed")
    wait_until(lambda: _series(served, sid)["end"] is not None
               and _series(served, sid)["points"][-1]["time"] == _series(served, sid)["end"], 30,
               "the history's last point at the end")
    body = _series(served, sid)
    page.reload()
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#series-note")).to_contain_text(f"{len(body['points'])} points", timeout=WAIT_MS)
    wait_points(page, "figure", len(body["points"]))
    assert points(page, "figure") == len(body["points"]) > 5  # the whole history, not one dot
    span = float(page.get_attribute("#figure", "data-span"))
    assert span == pytest.approx(body["end"] - body["start"], abs=0.01) and 3 < span < 600  # seconds, not years
    assert float(page.get_attribute("#figure", "data-from")) == pytest.approx(body["start"])
    assert float(page.get_attribute("#figure", "data-to")) == pytest.approx(body["end"])
    screenshot(page, "session-history")


def test_the_job_page_draws_a_point_per_epoch_and_follows_the_log(page, served: Served, long_job: dict) -> None:
    from playwright.sync_api import expect

    epochs = 3
    manifest = tiny_manifest(served.root, epochs=5)  # no loss improves by 100: a plateau at 3, the last epoch
    manifest["training"]["early_stopping"] = {"metric": "train_loss", "patience": 2, "min_delta": 100.0}
    job = served.m.submit(manifest)
    page.goto(f"/ui/jobs/{job['id']}")
    for epoch in range(1, epochs + 1):  # the curve gains one point per epoch, as the epochs end
        wait_points(page, "curves", epoch)
        assert points(page, "curves") <= len(served.m.http.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"])
    expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
    metrics = served.m.http.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"]
    assert points(page, "curves") == len(metrics) == epochs
    # against step: at least each epoch's last step (its final progress event, then its metrics at that step)
    wait_points(page, "step-curve", epochs)
    assert int(page.inner_text("#v-step")) >= epochs
    expect(page.locator("#v-acc")).to_have_text(f"{metrics[-1]['val_accuracy']:.3f}")
    page.wait_for_function("() => Number(document.getElementById('log').dataset.lines) > 0")
    logs = served.m.http.get(f"/v1/jobs/{job['id']}/logs", params={"pagesize": 5000}).json()["lines"]
    assert logs and logs[-1]["line"] in page.inner_text("#log")
    expect(page.locator("#log")).to_contain_text("[plateau] epoch 3: train_loss has not improved for 2 epoch(s); "
                                                 "best", timeout=WAIT_MS)  # the job's plateau event, in its log
    assert "at epoch 1; early stop" in page.inner_text("#log")
    expect(page.locator("#attempts tbody tr")).to_have_count(1)
    screenshot(page, "job")
    # the downloads are plain links on the login cookie
    with page.expect_download() as model:
        page.click("#download-model")
    assert model.value.path().stat().st_size > 0
    with page.expect_download() as bundle:
        page.click("#download-bundle")
    assert zipfile.is_zipfile(bundle.value.path())


def test_halt_pressed_in_the_page_halts_the_job_and_delete_removes_it(page, served: Served, long_job: dict) -> None:
    from playwright.sync_api import expect

    job = long_job
    # the overview shows its learner, with its heartbeat, among the learners seen
    page.goto("/ui/")
    learner = page.locator(f"#learners tr[data-job='{job['id']}'][data-rank='0']")
    expect(learner).to_contain_text("s ago", timeout=WAIT_MS)
    page.wait_for_function("() => Number(document.getElementById('t-learners-seen').textContent) >= 1")
    page.goto(f"/ui/jobs/{job['id']}")
    expect(page.locator("#status")).to_have_text("running", timeout=WAIT_MS)
    wait_points(page, "step-curve", 2)  # the step curve gains points while the job runs (~1 a second)
    wait_points(page, "step-curve", points(page, "step-curve") + 2)
    page.click("#controls button[data-action=halt]")  # mid-epoch: the learner checkpoints where it is
    expect(page.locator("#status")).to_have_text("halted", timeout=WAIT_MS)
    shown = served.m.show(job["id"])
    assert shown["status"] == "halted" and shown["checkpoint"]
    expect(page.locator("#controls button[data-action=resume]")).to_be_enabled()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#controls button[data-action=delete]")
    expect(page.locator("h1")).to_have_text("Overview", timeout=WAIT_MS)
    assert served.m.http.get(f"/v1/jobs/{job['id']}").status_code == 404


def test_the_overview_lists_sessions_and_jobs_and_refreshes_itself(page, served: Served) -> None:
    from playwright.sync_api import expect

    http = served.m.http
    sessions = http.get("/sessions").json()
    jobs = http.get("/v1/jobs").json()["jobs"]
    page.goto("/ui/")
    for s in sessions:
        expect(page.locator(f"#sessions tr[data-session='{s['id']}']")).to_contain_text(s["status"])
    for j in jobs:
        expect(page.locator(f"#jobs tr[data-job='{j['id']}']")).to_contain_text(j["status"])
    # a session started now, its worker run by the manager (local launcher), shows up without a reload
    data = write_dataset(served.root / "later", n_per_label=4)  # 16 samples at 1/s: it runs while we look
    assert http.post("/experiments", json=experiment_dict(data, served.root / "store", name="ui-later")).is_success
    started = http.post("/experiments/ui-later/sessions", json={"rate": 1, "launcher": "local", "workers": 1})
    assert started.status_code == 201, started.text
    sid = started.json()["id"]
    try:
        expect(page.locator(f"#sessions tr[data-session='{sid}']")).to_contain_text("running", timeout=WAIT_MS)
        seen = page.locator(f"#workers tr[data-session='{sid}']")
        expect(seen.locator("td[data-workers]")).to_have_text("1", timeout=WAIT_MS)
        expect(seen.locator("td[data-consumers]")).to_have_text("unknown")
        expect(page.locator("#t-workers")).to_have_text("1")
        screenshot(page, "overview")
        page.goto(f"/ui/sessions/{sid}")
        expect(page.locator("#v-workers")).to_have_text("1")
    finally:
        with contextlib.suppress(httpx.HTTPError):
            http.post(f"/sessions/{sid}/cancel")


def test_the_comparison_page_draws_a_curve_per_framework(page, served: Served) -> None:
    from playwright.sync_api import expect

    frameworks = ("allreduce", "downpour", "easgd")
    run = write_compare(served.root / "home", frameworks).name  # where the manager looks: <home>/compare/<run>
    page.click("#to-compare")
    expect(page.locator(f"#runs tr[data-run='{run}']")).to_contain_text("allreduce, downpour, easgd")
    page.click(f"#runs tr[data-run='{run}'] a")
    expect(page.locator("#table tbody tr")).to_have_count(len(frameworks))
    for figure in ("accuracy-time", "accuracy-samples", "loss-time", "loss-samples"):  # once its script has run
        expect(page.locator(f"#{figure}")).to_have_attribute("data-curves", str(len(frameworks)))
    for name in frameworks:  # each framework's curve, named in each figure's legend
        expect(page.locator("#accuracy-time .u-legend")).to_contain_text(name)
    screenshot(page, "compare")


def test_an_open_manager_on_loopback_needs_no_login(browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with manager(tmp_path) as m:  # no token: the embedded default, loopback clients only
        context = browser.new_context(base_url=m.server.url)
        page = context.new_page()
        console = Console(page)
        try:
            assert page.goto("/ui/").status == 200
            expect(page.locator("h1")).to_have_text("Overview")
            page.goto("/ui/login?next=/ui/")
            expect(page.locator("h1")).to_have_text("Overview")
        finally:
            context.close()
        assert console.errors == []
