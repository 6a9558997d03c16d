"""Two sessions share the same workers by weight (issue 4's acceptance), over a real RabbitMQ: two experiments,
two workers that consume both queues, the health controller steering both sessions. Each session's consume
rate is measured from its ledger over a window after convergence; the checks are on those averages, with the
issue's 20 % tolerance, never on instants."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import SR, delete_queue, experiment_dict, write_tone_set

from labswarm.client import ManagerClient
from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.health.loop import HealthLoop
from labswarm.health.monitors import ManagerMonitor, RabbitMQMonitor
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.app import queue_name
from labswarm.settings import Settings

pytestmark = pytest.mark.slow
MGMT_API = "http://guest:guest@127.0.0.1:15672"
#: Budget of messages waiting in both queues together (3 s of each session's consume rate would be more).
BUDGET = 40
#: Seconds given to converge at most (0-8 s in most runs; more than 20 s once in a fresh-clone CI, its 1:1 shares
#: still moving toward 0.5 at the deadline), and seconds each share is measured over.
CONVERGE, MEASURE = 45.0, 12.0
#: Seconds of decisions in a row the logged shares must stay within 20 % before the measure starts.
HOLD = 5.0


class _Health:
    """The health loop in a thread of the test, with a budget of waiting messages."""

    def __init__(self, manager_url: str, log_dir: Path) -> None:
        self.manager_url, self.log_dir = manager_url, log_dir
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the health loop's thread did not start within 10 s"

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        loop = HealthLoop(ManagerMonitor(self.manager_url), RabbitMQMonitor(MGMT_API), log_dir=self.log_dir,
                          max_total_waiting=BUDGET)
        try:
            await loop.run(self._stop)
        finally:
            await loop.manager.aclose()
            await loop.rabbitmq.aclose()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _consume_rates(client: ManagerClient, sessions: list[str], seconds: float) -> list[float]:
    """Samples/s each session finished over the next ``seconds``, from the manager's ledger."""
    before, t0 = [client.session(s)["finished"] for s in sessions], time.monotonic()
    time.sleep(seconds)  # the measure itself: rates over a window of real time, not a wait for a condition
    after, t1 = [client.session(s)["finished"] for s in sessions], time.monotonic()
    return [(b - a) / (t1 - t0) for a, b in zip(before, after, strict=True)]


def _log(path: Path, since_wall: float, until_wall: float = float("inf")) -> list[dict]:
    # whole lines only: the loop may be appending one while the test polls
    lines = path.read_text().splitlines(keepends=True)
    rows = [json.loads(line) for line in lines if line.endswith("\n") and line.strip()]
    return [r for r in rows if since_wall <= r["wall"] <= until_wall]


def _settle(paths: list[Path], share: float, since_wall: float, deadline: float = CONVERGE) -> None:
    """Wait until the first session's share of the consume rates the controller logs (5-s windows) has been
    within 20 % of ``share`` for :data:`HOLD` s of decisions in a row; fails the test when that has not happened
    within ``deadline`` s (it used to return then, and the shares were measured on a controller that had not
    converged). The shares are then measured from the ledger."""
    end = time.monotonic() + deadline
    logs: list[list[dict]] = []
    while time.monotonic() < end:
        logs = [_log(path, since_wall) if path.is_file() else [] for path in paths]
        if all(logs) and (held := _convergence(logs, share, since_wall)) is not None \
                and logs[0][-1]["wall"] - since_wall - held >= HOLD:
            return
        time.sleep(0.25)
    last = [(a["consume_rate"], b["consume_rate"]) for a, b in zip(*logs, strict=False)][-8:] if all(logs) else []
    pytest.fail(f"the first session's share of the consume rates did not stay within 20 % of {share} for {HOLD} s "
                f"within {deadline} s; the last logged rates (first, second): {last}", pytrace=False)


def _convergence(logs: list[list[dict]], share: float, since_wall: float) -> float | None:
    """Seconds from ``since_wall`` until the first session's share of the logged consume rates (5-s windows)
    came within 20 % of ``share`` for good (None: never); for the report, not asserted."""
    last_out = since_wall
    for a, b in zip(*logs, strict=False):
        total = a["consume_rate"] + b["consume_rate"]
        if total <= 0 or abs(a["consume_rate"] / total - share) > 0.2 * share:
            last_out = max(a["wall"], b["wall"])
    return last_out - since_wall if last_out < logs[0][-1]["wall"] else None


def _s(seconds: float | None) -> str:
    return "(not for good in the log)" if seconds is None else f"{seconds:.0f} s"


def test_two_sessions_share_the_workers_by_weight(rabbitmq_url: str, tmp_path: Path) -> None:
    data = write_tone_set(tmp_path / "data", tones=130)  # 3,120 samples a session: enough for ~50/s in all
    names = [f"fa-{uuid.uuid4().hex[:8]}", f"fb-{uuid.uuid4().hex[:8]}"]
    settings = Settings(home=tmp_path / "home", broker_url=rabbitmq_url, reconcile_after=5.0)
    server = EmbeddedServer(create_app(settings)).start()
    launcher = health = None
    try:
        with ManagerClient(server.url, timeout=30.0) as client:
            for name in names:  # the same clips and work (24 pitch shifts, ~40 ms each), a feature store each
                client.post_experiment(parse_experiment(experiment_dict(
                    data, tmp_path / f"store-{name}", name=name,
                    dataset={"root": str(data), "sample_rate": SR, "segment": {"start": 0.0, "duration": 10.0}},
                    transformations=[{"name": "pitch_shift", "semitones": s} for s in range(-12, 13) if s],
                    features=[{"name": "mel", "n_mels": 64}])).model_dump(mode="json"))
            launcher = LocalLauncher(names, server.url, broker_url=rabbitmq_url, log_dir=tmp_path / "logs")
            launcher.start(2)  # each worker consumes both queues
            deadline = time.monotonic() + 60
            while not all(psutil.Process(p.pid).children() for p in launcher.processes):
                assert time.monotonic() < deadline, "workers did not start their pools"
                time.sleep(0.2)
            sessions = [client.start_session(name, 40.0)["id"] for name in names]
            health = _Health(server.url, tmp_path / "health")
            started, started_wall = time.monotonic(), time.time()

            # weights 1:1: each session gets half the workers
            paths = [tmp_path / "health" / f"health-{s}.jsonl" for s in sessions]
            _settle(paths, 0.5, started_wall)
            since = time.time()
            equal = _consume_rates(client, sessions, MEASURE)
            share = equal[0] / sum(equal)
            assert abs(share - 0.5) <= 0.2 * 0.5, equal
            logs = {s: _log(tmp_path / "health" / f"health-{s}.jsonl", since) for s in sessions}
            assert all(r["cap"] is None for s in sessions for r in logs[s])  # equal weights cap nobody
            # the total waiting is held to the budget (targets), and so on average is the total depth
            by_tick = zip(*(logs[s] for s in sessions), strict=False)
            totals = [(sum(r["target"] for r in rows), sum(r["depth"] for r in rows)) for rows in by_tick]
            assert max(t for t, _ in totals) <= BUDGET + 1e-6, totals
            assert sum(d for _, d in totals) / len(totals) <= 2 * BUDGET, totals

            # weight 3:1: the first session gets three quarters
            client.set_weight(sessions[0], 3.0)
            changed = time.time()
            _settle(paths, 0.75, changed)
            weighted = _consume_rates(client, sessions, MEASURE)
            share3 = weighted[0] / sum(weighted)
            assert abs(share3 - 0.75) <= 0.2 * 0.75, weighted
            progress = [client.session(s) for s in sessions]
            assert all(p["status"] == "running" for p in progress), progress  # measured while both had work
            equal_in = _convergence([_log(tmp_path / "health" / f"health-{s}.jsonl", 0, changed) for s in sessions],
                                    0.5, started_wall)
            weighted_in = _convergence([_log(tmp_path / "health" / f"health-{s}.jsonl", changed) for s in sessions],
                                       0.75, changed)
            print(f"\nshares 1:1 {share:.3f}/{1 - share:.3f} ({sum(equal):.1f}/s, within 20 % after {_s(equal_in)}), "
                  f"3:1 {share3:.3f}/{1 - share3:.3f} ({sum(weighted):.1f}/s, within 20 % {_s(weighted_in)} after "
                  f"the change); {time.monotonic() - started:.0f} s of sessions")
    finally:
        if health is not None:
            health.stop()
        if launcher is not None:
            launcher.stop(15)
        server.stop()
        for name in names:
            delete_queue(rabbitmq_url, queue_name(name))
