"""Benchmark: many users at once on one manager (issue 26; the DLaaS usage study's "up to 45 users
simultaneously", "over 200 jobs in three hours").

    .venv/bin/python bench/tenants.py [--users 8] [--jobs-per-user 4] [--greedy-jobs 16] [--slots 2]
                                      [--job-seconds 1.0 | --train [--warm-start]] [--sessions 0] [--session-every 30]
                                      [--database sqlite|postgres] [--amqp URL]

    full scale: --users 44 --jobs-per-user 4 --greedy-jobs 24 --sessions 10   (44 + greedy = 45 users, 200 jobs)

A manager in a process of its own (SQLite, or a fresh schema on the PostgreSQL test server) with a tokens file of
``--users`` users, each with their own token, equal weights and no quotas. Every user, in a thread of its own,
submits ``--jobs-per-user`` small jobs, all but one at a random moment of the first half of ``--spread`` seconds
and the last in the second half, and
meanwhile polls the job list, shows its own jobs, opens a dashboard page and follows its newest job's event stream,
with 0.5-1.5 s of think time; one more user (``greedy``) submits ``--greedy-jobs`` at once at the start (trying
to take every slot); one client floods wrong tokens as fast as it can. The jobs are ``command`` learners that
sleep ``--job-seconds`` (the users are admins: a user may not run ``command`` learners), so the run measures the
manager, not training.

Reported: API latency p50/p99 of lists, shows, submissions and dashboard pages (every request of the users, the
flood's apart), the count of 5xx answers; each job's terminal state (all must be completed, none lost); per-user
queue waits (queued -> pending); Jain's fairness index of the users' shares of slot time (learner-seconds) over
the instants at which every user had a job waiting (the contended window: with equal weights each is due the
same share there); the manager's RSS at the start and end of the run and
its peak; the flood's answers (401 then 429) and its rate. The machine may be shared: latencies are this run's.

With ``--sessions N``, N feature sessions too, one every ``--session-every`` seconds from the start, each by the
next user in turn on an experiment of their own over the same clips (mel features), its workers run by the
manager (``launcher: local``, 1 worker); reported: each session's end state and time to it, and the 429s of
quotas if any (none: no quotas here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from jobs import write_data
from tenants_report import analyse, figures, report

from labswarm.auth.tokens import add_token, new_token
from labswarm.client import parse_sse
from labswarm.manager.server import free_port

POSTGRES = "postgresql+psycopg://labswarm:labswarm@127.0.0.1:5432/labswarm_test"
SERVE = """
import sys
from labswarm.manager.api import create_app
from labswarm.manager.server import serve
from labswarm.settings import Settings
serve(create_app(Settings()), "127.0.0.1", int(sys.argv[1]))
"""
SLEEP = "import sys, time; print('started', flush=True); time.sleep(float(sys.argv[1]))"
TERMINAL = ("completed", "failed")


class Record:
    """Latencies and status codes of the users' requests, by kind; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, list[float]] = {}
        self.codes: dict[int, int] = {}

    def call(self, kind: str, request) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = request()
        except httpx.HTTPError as exc:
            with self.lock:
                self.codes[-1] = self.codes.get(-1, 0) + 1
            print(f"  {kind}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return None
        with self.lock:
            self.seconds.setdefault(kind, []).append(time.perf_counter() - started)
            self.codes[response.status_code] = self.codes.get(response.status_code, 0) + 1
        return response


def manifest(data: Path, results: Path, user: str, name: str, seconds: float | None) -> dict:
    """A ``command`` job that sleeps ``seconds``, or with ``seconds`` None a training job (the native framework):
    one epoch of the inline experiment (the 6 clips of ``write_data(data, 2)``: 1 s, 3 classes), the ``mlp``
    model (one hidden layer of 16) on the mean and deviation of 32 mel bands, one thread, batches of 8 read in
    the learner's own process (no prefetch producers: forking two producer processes and loading the audio
    libraries in them took ~6 s of each epoch's and each validation's start for 6 clips), the validation split
    and the checkpoint and model stored as any job's. The inline experiment is the user's own (names are
    owned); the features are computed by the first jobs into the store all users share, read from it after."""
    experiment = {
        "name": f"exp-{user}", "dataset": {"root": str(data), "sample_rate": 16000,
                                           "segment": {"start": 0.0, "duration": 1.0}},
        "transformations": [{"name": "identity"}], "features": [{"name": "mel", "n_mels": 32}],
        "store": {"root": str(data.parent / "store")}, "model": {"name": "mlp", "input": "mel", "hidden": [16]},
        "pipeline": [{"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 8}],
        "training": {"epochs": 1, "threads": 1}}
    job = {"name": name, "experiment": experiment, "results_store": {"name": "local", "path": str(results)}}
    if seconds is not None:
        job["framework"] = {"name": "command", "command": [sys.executable, "-c", SLEEP, str(seconds)]}
    return job


def user(url: str, token: str, name: str, submissions: list[tuple[float, int]], job: dict, record: Record,
         t0: float, done: threading.Event, mine: list[str]) -> None:
    """One user's session: submissions ``[(at s, count)]``, then polling until every job of theirs ended."""
    rng = random.Random(name)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        pending = sorted(submissions)
        followers: list[threading.Thread] = []
        while not done.is_set():
            while pending and time.monotonic() - t0 >= pending[0][0]:
                _, count = pending.pop(0)
                for _ in range(count):
                    answer = record.call("submit", lambda: http.post("/v1/jobs", json={
                        **job, "name": f"{name}-{len(mine)}"}))
                    if answer is not None and answer.status_code == 201:
                        mine.append(answer.json()["id"])
                if mine:
                    follower = threading.Thread(target=follow, args=(url, token, mine[-1]), daemon=True)
                    follower.start()
                    followers.append(follower)
            record.call("list", lambda: http.get("/v1/jobs", params={"limit": 20}))
            if mine:
                shown = record.call("show", lambda: http.get(f"/v1/jobs/{rng.choice(mine)}"))
                del shown
            if rng.random() < 0.2:
                record.call("page", lambda: http.get("/ui/"))
            if not pending and mine and all_ended(http, mine):
                break
            time.sleep(rng.uniform(0.5, 1.5))
        for follower in followers:
            follower.join(timeout=5)


def sessions(url: str, tokens: dict[str, str], names: list[str], count: int, every: float, data: Path,
             record: Record, t0: float, out: list[dict]) -> None:
    """Start ``count`` feature sessions, one every ``every`` s, by ``names`` in turn, each on an experiment of its
    user's, polling the started ones meanwhile (once a second) until each has ended, at most 600 s after the last
    start. ``out``: one ``{user, status, seconds}`` a session, ``seconds`` from its start to the first poll that
    saw it ended (``status`` ``refused``: its start was not a 201)."""
    started: list[tuple[str, str, float, httpx.Client]] = []
    try:
        i, deadline = 0, t0 + (count - 1) * every + 600
        while (i < count or started) and time.monotonic() < deadline:
            if i < count and time.monotonic() >= t0 + i * every:  # the next start is due
                start_session(url, tokens, names[i % len(names)], i, data, record, started, out)
                i += 1
            for entry in list(started):  # the started ones polled meanwhile: their times are theirs
                name, sid, at, http = entry
                shown = record.call("show", lambda h=http, s=sid: h.get(f"/sessions/{s}"))
                if shown is not None and shown.status_code == 200 and shown.json()["status"] not in ("running",
                                                                                                    "paused"):
                    out.append({"user": name, "status": shown.json()["status"], "seconds": time.monotonic() - at})
                    started.remove(entry)
                    http.close()
            time.sleep(1.0)
    finally:
        for name, _, _, http in started:
            out.append({"user": name, "status": "not ended", "seconds": float("nan")})
            http.close()


def start_session(url: str, tokens: dict[str, str], name: str, i: int, data: Path, record: Record,
                  started: list[tuple[str, str, float, httpx.Client]], out: list[dict]) -> None:
    """``name`` registers the experiment ``feat-<name>-<i>`` and starts its session with one local worker: added
    to ``started``, or to ``out`` as ``refused``."""
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=120)
    experiment = {**manifest(data, data, name, "x", 0)["experiment"], "name": f"feat-{name}-{i}"}
    experiment["store"] = {"root": str(data.parent / "feature-store")}
    record.call("register", lambda: http.post("/experiments", json=experiment))
    answer = record.call("session", lambda: http.post(f"/experiments/{experiment['name']}/sessions",
                                                      json={"launcher": "local", "workers": 1}))
    if answer is None or answer.status_code != 201:
        out.append({"user": name, "status": "refused", "seconds": float("nan")})
        http.close()
        return
    started.append((name, answer.json()["id"], time.monotonic(), http))


def all_ended(http: httpx.Client, ids: list[str]) -> bool:
    page = http.get("/v1/jobs", params={"status": list(TERMINAL), "limit": 500}).json()["jobs"]
    ended = {job["id"] for job in page}
    return all(job_id in ended for job_id in ids)


def follow(url: str, token: str, job_id: str) -> None:
    """Follow the job's event stream to its end (what ``labswarm jobs follow`` does)."""
    with contextlib.suppress(httpx.HTTPError), httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as http, \
            http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        for event in parse_sse(response.iter_lines()):
            if event.get("event") == "status" and event.get("data", {}).get("status") in TERMINAL:
                return


def flood(url: str, stop: threading.Event, codes: dict[int, int]) -> None:
    """Wrong tokens (the issued shape, a different one each time) as fast as one client can send them."""
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                status = http.get("/v1/jobs", headers={"Authorization": f"Bearer {new_token()}"}).status_code
                codes[status] = codes.get(status, 0) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=8, help="users besides the greedy one")
    parser.add_argument("--jobs-per-user", type=int, default=4)
    parser.add_argument("--greedy-jobs", type=int, default=16)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--job-seconds", type=float, default=1.0)
    parser.add_argument("--train", action="store_true", help="jobs that train one epoch of a tiny experiment "
                        "instead of sleeping --job-seconds")
    parser.add_argument("--warm-start", action="store_true", help="learners forked by the manager's warm process "
                        "(LABSWARM_LEARNER_WARM_START: labswarm and torch imported once, not per job)")
    parser.add_argument("--spread", type=float, default=10.0, help="seconds over which the users submit")
    parser.add_argument("--sessions", type=int, default=0, help="feature sessions over the run (local workers)")
    parser.add_argument("--session-every", type=float, default=30.0, help="seconds between two session starts")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--amqp", help="the sessions' broker (e.g. amqp://guest:guest@127.0.0.1:5672//); default: "
                        "the embedded SQLite broker")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file (the CI-sized test)")
    parser.add_argument("--log", type=Path, help="copy the manager's log here at the end")
    parser.add_argument("--deadline", type=float, help="seconds after which the users stop waiting for their jobs "
                        "and the figures are taken as they are (jobs not ended are reported in their state)")
    args = parser.parse_args()
    # a run stopped with SIGTERM (or SIGINT, ignored in a background job) still stops its manager and learners
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as tmp:
        root = Path(tmp)
        write_data(root / "data", 2)
        names = [f"u{i:02d}" for i in range(args.users)] + ["greedy"]
        tokens = {name: add_token(root / "tokens.yaml", name, "admin") for name in [*names, "observer"]}
        env = {**os.environ, "LABSWARM_HOME": str(root / "home"), "LABSWARM_TOKENS_FILE": str(root / "tokens.yaml"),
               "LABSWARM_JOB_SLOTS": str(args.slots), "LABSWARM_DATA_ROOTS": str(root),
               "LABSWARM_API_TOKEN": new_token()}  # the token of the local workers of the feature sessions
        if args.amqp:
            env["LABSWARM_BROKER_URL"] = args.amqp
        if args.warm_start:
            env["LABSWARM_LEARNER_WARM_START"] = "true"
        schema = None
        if args.database == "postgres":
            from sqlalchemy import create_engine, text

            schema = f"bench_{uuid.uuid4().hex[:10]}"
            admin = create_engine(POSTGRES)
            with admin.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA {schema}"))
            env["LABSWARM_DATABASE_URL"] = f"{POSTGRES}?options=-csearch_path%3D{schema}"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(root / "manager.log", "wb")  # noqa: SIM115 - closed at the end
        manager = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
        try:
            run(args, url, tokens, names, manager, root)
        finally:
            manager.terminate()
            try:
                manager.wait(60)
            except subprocess.TimeoutExpired:
                manager.kill()
                manager.wait()
            log.close()
            if args.log is not None:
                shutil.copyfile(root / "manager.log", args.log)
            leftovers(root)
            if schema is not None:
                with admin.begin() as conn:
                    conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


def leftovers(root: Path) -> None:
    """Kill the process groups of the learners and workers the manager left running (a stopped manager leaves its
    learners for the next one to re-attach; an interrupted run leaves some): those whose command line names
    ``root``."""
    mine = os.getpgid(0)
    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(str(root) in part for part in process.info["cmdline"] or []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(process.info["pid"])
                if group != mine:
                    os.killpg(group, 9)


def run(args, url: str, tokens: dict[str, str], names: list[str], manager: subprocess.Popen, root: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline or manager.poll() is not None:
            raise SystemExit(f"the manager did not start: {(root / 'manager.log').read_text()[-3000:]}")
        time.sleep(0.5)
    process = psutil.Process(manager.pid)
    rss = [process.memory_info().rss]
    record, flooded, done, stop = Record(), {}, threading.Event(), threading.Event()
    rng = random.Random(0)
    t0 = time.monotonic()
    threads, owned = [], {name: [] for name in names}
    for name in names:
        if name == "greedy":
            plan = [(0.0, args.greedy_jobs)]
        else:
            first = max(1, args.jobs_per_user - 1)  # most at once: every user keeps a job waiting a while
            plan = [(rng.uniform(0, args.spread / 2), first),
                    (rng.uniform(args.spread / 2, args.spread), args.jobs_per_user - first)]
            plan = [(at, n) for at, n in plan if n]
        job = manifest(root / "data", root / "results", name, "job", None if args.train else args.job_seconds)
        threads.append(threading.Thread(target=user, args=(url, tokens[name], name, plan, job, record, t0, done,
                                                           owned[name]), daemon=True))
    flooder = threading.Thread(target=flood, args=(url, stop, flooded), daemon=True)
    ended: list[dict] = []
    if args.sessions:
        threads.append(threading.Thread(target=sessions, daemon=True, args=(
            url, tokens, names[:-1] or names, args.sessions, args.session_every, root / "data", record, t0, ended)))
    for thread in [*threads, flooder]:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        if args.deadline is not None and time.monotonic() - t0 > args.deadline:
            done.set()
        time.sleep(1.0)
        rss.append(process.memory_info().rss)
    wall = time.monotonic() - t0
    stop.set()
    flooder.join(timeout=30)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens['observer']}"}, timeout=120) as http:
        result = analyse(http, names)
    result["sessions"] = ended
    report(args, wall, record, flooded, result, rss, names)
    if args.json is not None:
        args.json.write_text(json.dumps(figures(wall, record, flooded, result, rss), indent=1))


if __name__ == "__main__":
    main()
