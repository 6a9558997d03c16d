"""Benchmark: one session of N trivial samples through a real manager, RabbitMQ and 2 workers; the manager's
memory over the session, publish and consume rates, reconciliation time.

    .venv/bin/python bench/scale.py [--samples 10000 100000 1000000] [--workers 2] [--rate 5000]
                                    [--purge-at 0.5] [--amqp URL] [--api URL]

For each N: a fresh trivial data set (bench/distributed.py's ``trivial_experiment``: tiny clips x 5 gains, one
small STFT, ~0.3 ms of compute per task), a manager in its own process (``labswarm manager``, SQLite state,
RabbitMQ broker; so its resident memory is its own), ``--workers`` worker processes, and a session publishing at
``--rate`` tasks/s. While it runs, this process polls what a deployment polls every second (``GET /sessions``,
``GET /metrics`` and the session's progress) and samples the manager's RSS (psutil).

Reconciliation is triggered on purpose: once ``--purge-at`` of the samples are published, the queue's ready
messages are purged through the RabbitMQ management API (lost messages), so the session can only end by
republishing them in its reconcile phase.

Printed per N: publish rate (samples published / publish-phase seconds), consume rate (steady, from the
workers' finish times in the ledger), RSS at every tenth of the session, the slope of a linear fit of RSS
against finished samples over the second half (MB per 10k samples), and the reconcile phase's duration with
the number of samples republished. Goal (issue 10): RSS < 300 MB and flat with 1,000,000 samples.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


@dataclass
class Trace:
    """What the poller saw: one row per poll ``(t s, finished, published, rss MB, phase)``."""

    rows: list[tuple[float, int, int, float, str | None]] = field(default_factory=list)
    purged: int = 0
    publish_end: float | None = None
    reconcile_start: float | None = None
    reconcile_end: float | None = None
    republished: int = 0
    errors: list[str] = field(default_factory=list)


def slope_mb_per_10k(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS (MB) against finished samples over the second half of ``points``,
    in MB per 10,000 samples (``nan`` with fewer than 3 points)."""
    half = points[len(points) // 2:]
    if len(half) < 3 or half[-1][0] == half[0][0]:
        return float("nan")
    x = np.array([p[0] for p in half], dtype=float)
    y = np.array([p[1] for p in half], dtype=float)
    return float(np.polyfit(x, y, 1)[0] * 10_000)


def start_manager(home: Path, amqp: str, port: int, log: Path) -> subprocess.Popen:
    """``labswarm manager`` on ``port`` with its state in ``home``; stdout/stderr to ``log``."""
    env = dict(os.environ, LABSWARM_HOME=str(home), LABSWARM_RECONCILE_AFTER="3",
               LABSWARM_MAX_QUEUE_LENGTH="0", LABSWARM_DATA_ROOTS=json.dumps([str(home.parent)]))
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "labswarm.cli", "manager", "--port", str(port),
                                 "--broker", amqp], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_for(predicate, deadline_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s until true; ``SystemExit`` naming ``what`` after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def poll(url: str, api: str, queue: str, session_id: str, pid: int, n: int, purge_at: float, trace: Trace,
         done: threading.Event, period: float = 1.0) -> None:
    """Every ``period`` s: what the health loop and Prometheus poll, the session's progress and the manager's
    RSS; purge the queue once when ``purge_at`` of the samples are published."""
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as http, httpx.Client(timeout=10) as mgmt:
        while not done.is_set():
            try:
                http.get("/sessions", params={"status": "running"}).raise_for_status()
                http.get("/metrics").raise_for_status()
                p = http.get(f"/sessions/{session_id}").json()
                rss = proc.memory_info().rss / 2**20
            except (httpx.HTTPError, psutil.Error) as exc:
                trace.errors.append(repr(exc))
                done.wait(period)
                continue
            now = time.monotonic() - t0
            finished = p["done"] + p["cached"] + p["failed"]
            trace.rows.append((now, finished, p["published"], rss, p["phase"]))
            if not trace.purged and purge_at < 1 and p["published"] >= purge_at * n:
                q = mgmt.get(f"{api}/api/queues/%2F/{quote(queue, safe='')}").json()
                mgmt.delete(f"{api}/api/queues/%2F/{quote(queue, safe='')}/contents").raise_for_status()
                trace.purged = max(1, int(q.get("messages_ready") or 0))
            if p["phase"] == "reconcile" and trace.publish_end is None:
                trace.publish_end = now
            if p["republished"] and trace.reconcile_start is None:
                trace.reconcile_start = now
            if p["status"] != "running":
                trace.reconcile_end, trace.republished = now, p["republished"]
                if p["status"] != "completed":
                    trace.errors.append(f"session ended {p['status']}: {p.get('error')}")
                return
            done.wait(period)


def run_one(n: int, args: argparse.Namespace, tmp: Path) -> Trace:
    """One session of ``n`` trivial samples; returns the poller's trace."""
    from distributed import steady_rate, trivial_experiment

    from labswarm.client import ManagerClient
    from labswarm.deploy.local import LocalLauncher
    from labswarm.manager.server import free_port

    n_clips = math.ceil(n / 5)
    base = tmp / f"n{n}"
    t0 = time.perf_counter()
    config = trivial_experiment(base, n_clips).model_copy(update={"name": f"scale-{n}"})
    print(f"\n== {n:,} samples ({n_clips:,} clips x 5); data set written in {time.perf_counter() - t0:.0f} s",
          flush=True)
    home = base / "home"
    home.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    manager = start_manager(home, args.amqp, port, base / "manager.log")
    launcher = None
    trace = Trace()
    try:
        wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, 60, "the manager")
        client = ManagerClient(url, timeout=300)  # a session start reads the whole labels file (200k rows at 1M)
        client.post_experiment(config.model_dump(mode="json"))
        launcher = LocalLauncher(config.name, url, broker_url=args.amqp, log_dir=base / "workers")
        launcher.start(args.workers)
        session = client.start_session(config.name, rate=args.rate)
        client.set_rate(session["id"], args.rate)  # someone steers: the start window is lifted
        done = threading.Event()
        poll(url, args.api, session["queue"], session["id"], manager.pid, n, args.purge_at, trace, done)
        rate, _ = steady_rate(home, session["id"])
        report(n, trace, rate)
    finally:
        if launcher is not None:
            launcher.stop()
        manager.terminate()
        try:
            manager.wait(30)
        except subprocess.TimeoutExpired:
            manager.kill()
    return trace


def report(n: int, trace: Trace, consume_rate: float) -> None:
    """Print one session's figures."""
    rows = trace.rows
    pub_end = trace.publish_end or (rows[-1][0] if rows else float("nan"))
    published_then = next((r[2] for r in rows if r[0] >= pub_end), rows[-1][2] if rows else 0)
    print(f"publish: {published_then:,} messages in {pub_end:.0f} s = {published_then / max(pub_end, 1e-9):.0f} "
          f"samples/s (bounded by the consumers' pace with a finite rate); consume: {consume_rate:.0f} samples/s "
          f"steady with the workers", flush=True)
    print("| finished | t s | RSS MB |")
    print("|---:|---:|---:|")
    for tenth in range(11):
        target = n * tenth / 10
        row = next((r for r in rows if r[1] >= target), rows[-1] if rows else None)
        if row:
            print(f"| {row[1]:,} | {row[0]:.0f} | {row[3]:.1f} |")
    points = [(r[1], r[3]) for r in rows]
    peak = max((r[3] for r in rows), default=float("nan"))
    steady = [(r[1], r[3]) for r in rows if r[4] == "publish"]
    step = rows[-1][3] - steady[-1][1] if rows and steady else float("nan")
    print(f"RSS peak {peak:.1f} MB; slope over the second half: {slope_mb_per_10k(points):+.2f} MB per 10k samples "
          f"(publish phase only: {slope_mb_per_10k(steady):+.2f}); reconcile phase adds {step:+.1f} MB")
    if trace.reconcile_start is not None and trace.reconcile_end is not None:
        print(f"reconciliation: {trace.purged:,} ready messages purged at {trace.purged and 'publish'}; "
              f"{trace.republished:,} republished; from the first republish to completion "
              f"{trace.reconcile_end - trace.reconcile_start:.1f} s; reconcile phase "
              f"{trace.reconcile_end - (trace.publish_end or trace.reconcile_start):.1f} s", flush=True)
    for err in trace.errors[:5]:
        print(f"error: {err}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=5000.0, help="publish rate, tasks/s")
    parser.add_argument("--purge-at", type=float, default=0.5,
                        help="share of the samples published when the queue is purged (1: never)")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--api", default="http://guest:guest@127.0.0.1:15672", help="RabbitMQ management API")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-scale-"))
    for n in args.samples:
        run_one(n, args, tmp)


if __name__ == "__main__":
    main()
