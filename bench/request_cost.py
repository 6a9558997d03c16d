"""Benchmark: the manager's CPU per HTTP request on the workers' hot path (issue 10, item 2).

    .venv/bin/python bench/request_cost.py [-n N] [--amqp URL] [--baseline REF]

Starts a real manager process (``labswarm manager``, SQLite state, the embedded broker or RabbitMQ with
``--amqp``), registers bench/distributed.py's trivial experiment, starts a session (start window lifted, no
workers) and waits until every sample is published; then sends N requests of each kind from this process over
one keep-alive connection and prints the manager process's CPU ms per request (``psutil`` user + system delta
over the N requests, minus the process's idle CPU per second, measured before, times the seconds they took):

- ``GET /health``, ``GET /sessions/{id}``, ``GET /metrics``;
- ``POST /sessions/{id}/outcomes`` with 1, 10 and 100 outcomes, each of samples not reported before.

``--baseline REF`` (default ``HEAD``): the same measurement on a second manager running the code of the git
revision REF (exported to a temporary folder and put first on its ``PYTHONPATH``), in the same run, the two
managers measured alternately kind by kind: the side-by-side baseline of the benchmark rule. ``--baseline ''``
measures the working tree only. CPU figures on a shared machine are noisy: compare the columns, not runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

TOKEN = "bench-requests-token"
#: Outcomes per POST of each outcomes kind.
SIZES = (1, 10, 100)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` and its children (none expected)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


class Manager:
    """One ``labswarm manager`` process on a free port, with its own home; ``src``: code first on PYTHONPATH."""

    def __init__(self, label: str, tmp: Path, amqp: str | None, src: Path | None) -> None:
        self.label, self.home, self.port = label, tmp / f"home-{label}", free_port()
        self.home.mkdir()
        env = {**os.environ, "LABSWARM_HOME": str(self.home), "LABSWARM_API_TOKEN": TOKEN,
               "LABSWARM_START_WINDOW": str(10**9), "LABSWARM_DATA_ROOTS": str(tmp),
               "LABSWARM_MAX_QUEUE_LENGTH": "0"}  # every sample published at once, past RabbitMQ's default bound
        env.pop("LABSWARM_DATABASE_URL", None)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-c", "from labswarm.cli.main import app; app()", "manager", "--port", str(self.port)]
        if amqp:
            cmd += ["--broker", amqp]
        with open(self.home / "manager.log", "w") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=log)
        self.ps = psutil.Process(self.proc.pid)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"manager {label} did not start: see {self.home / 'manager.log'}")
            time.sleep(0.2)

    def start_session(self, experiment: dict, total: int) -> None:
        """Register the experiment, start a session, wait until its ``total`` samples are in the ledger."""
        self.http.post("/experiments", json=experiment).raise_for_status()
        r = self.http.post(f"/experiments/{experiment['name']}/sessions", json={"rate": 50_000})
        r.raise_for_status()
        self.session = r.json()["id"]
        deadline = time.monotonic() + 300
        while (p := self.http.get(f"/sessions/{self.session}").json())["pending"] < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"manager {self.label}: only {p['pending']} of {total} published in 300 s")
            time.sleep(0.5)
        with sqlite3.connect(self.home / "manager.sqlite") as conn:
            self.samples = [r[0] for r in conn.execute(
                "SELECT sample_id FROM samples WHERE session_id = ? ORDER BY sample_id", (self.session,))]
        time.sleep(2)  # the publisher's last writes settle

    def idle_rate(self, seconds: float = 2.0) -> float:
        """CPU seconds per second of the manager doing nothing we asked (publisher polling, loops)."""
        a, t = cpu_s(self.ps), time.monotonic()
        time.sleep(seconds)
        return (cpu_s(self.ps) - a) / (time.monotonic() - t)

    def measure(self, kind: str, n: int, idle: float) -> float:
        """CPU ms of the manager per request of ``kind`` (idle CPU subtracted)."""
        requests = []
        if kind.startswith("outcomes"):
            size = int(kind[len("outcomes x"):])
            for _ in range(n):
                batch, self.samples = self.samples[:size], self.samples[size:]
                if len(batch) < size:
                    raise SystemExit("not enough samples published: raise the clip count")
                body = {"outcomes": [{"sample_id": s, "status": "computed", "seconds": 0.001,
                                      "finished_at": time.time()} for s in batch]}
                requests.append(("POST", f"/sessions/{self.session}/outcomes", body))
        else:
            path = {"health": "/health", "session": f"/sessions/{self.session}", "metrics": "/metrics"}[kind]
            requests = [("GET", path, None)] * n
        a, t = cpu_s(self.ps), time.monotonic()
        for method, path, body in requests:
            self.http.request(method, path, json=body).raise_for_status()
        used, wall = cpu_s(self.ps) - a, time.monotonic() - t
        return 1000 * max(used - idle * wall, 0.0) / n

    def close(self) -> None:
        if getattr(self, "session", None):  # purges its queue (RabbitMQ keeps it otherwise)
            self.http.post(f"/sessions/{self.session}/cancel")
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def experiment(tmp: Path, n_clips: int) -> dict:
    """bench/distributed.py's trivial experiment (its files written under ``tmp``), as the JSON to post."""
    from distributed import trivial_experiment

    trivial_experiment(tmp, n_clips)
    return {"name": "trivial", "dataset": {"root": str(tmp / "trivial"),
                                           "segment": {"start": 0.0, "duration": 0.05}},
            "transformations": [{"name": "gain", "gain_db": g} for g in (-6, -3, 0, 3, 6)],
            "features": [{"name": "stft", "n_fft": 256, "hop_length": 128}],
            "store": {"root": str(tmp / "store-trivial")}}


def export(ref: str, tmp: Path) -> Path:
    """The ``labswarm`` package of git revision ``ref``, extracted under ``tmp``; returns the folder to put on
    PYTHONPATH."""
    out = tmp / f"src-{ref.replace('/', '_')}"
    out.mkdir()
    archive = tmp / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "labswarm"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    return out


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the managers are stopped on a kill too
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=100, help="requests of each kind (default 100)")
    parser.add_argument("--amqp", default=None, help="RabbitMQ URL (default: the embedded broker)")
    parser.add_argument("--baseline", default="HEAD", help="git revision measured beside the working tree")
    args = parser.parse_args()
    kinds = ["health", "session", *(f"outcomes x{s}" for s in SIZES), "metrics"]
    total = args.n * sum(SIZES) + 20  # + the warm-up requests
    with tempfile.TemporaryDirectory(prefix="lsreq-") as name:
        tmp = Path(name)
        exp = experiment(tmp, -(-total // 5))
        managers = [Manager("tree", tmp, args.amqp, None)]
        if args.baseline:
            managers.append(Manager(args.baseline, tmp, args.amqp, export(args.baseline, tmp)))
        try:
            for i, m in enumerate(managers):  # own queue each: they may share a RabbitMQ
                m.start_session({**exp, "name": f"trivial{i}"}, total)
            idle = {m.label: m.idle_rate() for m in managers}
            print(f"load {os.getloadavg()[0]:.1f}, {args.n} requests per kind, broker "
                  f"{args.amqp or 'embedded'}; idle CPU " + ", ".join(f"{k} {1000 * v:.0f} ms/s"
                                                                    for k, v in idle.items()))
            print("| request | " + " | ".join(f"{m.label} ms CPU" for m in managers)
                  + (" | ratio |" if len(managers) > 1 else " |"))
            print("|---" * (len(managers) + 1 + (len(managers) > 1)) + "|")
            for kind in kinds:
                for m in managers:  # a warm-up request of each kind (imports, prepared statements)
                    m.measure(kind if not kind.startswith("outcomes") else "outcomes x1", 1, 0.0)
                ms = [m.measure(kind, args.n, idle[m.label]) for m in managers]
                ratio = f" | {ms[0] / ms[1]:.2f}" if len(ms) > 1 and ms[1] > 0 else ""
                label = {"health": "GET /health", "session": "GET /sessions/{id}", "metrics": "GET /metrics"}.get(
                    kind, f"POST outcomes {kind[len('outcomes '):]}")
                print(f"| {label} | " + " | ".join(f"{v:.2f}" for v in ms) + ratio + " |")
        finally:
            for m in managers:
                m.close()


if __name__ == "__main__":
    main()
