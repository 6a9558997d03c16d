"""Benchmark: the publisher's packing (samples per task message) A/B on real features, with a per-process CPU ledger.

    .venv/bin/python bench/packing_ab.py [DEMO_DIR] [--clips 30] [--pairs 3] [--arms target:0.25,target:0.5]
                                         [--local] [--out runs.jsonl]

Each pair runs `labswarm run --workers 2` over RabbitMQ with the default settings (start window, health
controller) once per arm, in this one process, the order alternating from pair to pair (issue 27: A/B pairs, not
runs an hour apart). An arm is ``target:SECONDS`` (the publisher packs about SECONDS of measured work a message:
``labswarm.sessions.packing.TARGET_SECONDS``) or ``fixed:N`` (N samples a message, the setting
``samples_per_message``). ``--local`` also runs the local process pool (``labswarm features --jobs 2``) first in
each pair, for the ratio the issue's goal names.

For each distributed run, over the steady middle (20 % to 80 % of the outcomes), the CPU ledger in ms of CPU (user +
system) per sample: the manager (this process, and each of its threads by name: the session's publisher
``session-<id>``, the HTTP server's event loop ``labswarm-manager``, its request threads ``AnyIO worker thread``,
the health controller, ...), each worker's main process, each pool process, RabbitMQ's ``beam`` processes (with
other users of the broker, theirs too), and the whole machine's; the messages published and their mean samples;
the manager's HTTP requests per second by route. A line of JSON per run (also appended to ``--out``), then a table.
The measured task time is wall time: on a loaded machine the same target packs fewer samples.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from distributed import CpuMeter  # noqa: E402 (bench/ on the path)
from steady_cpu import count_routes  # noqa: E402

MESSAGES: list[tuple[float, int]] = []  # (monotonic time, samples) of each message confirmed by the broker
REQUESTS: collections.Counter[str] = collections.Counter()  # "METHOD /route" -> requests


def instrument() -> None:
    """Count the messages the publisher sends and the manager's HTTP requests (wrappers, no behaviour change)."""
    import labswarm.sessions.broker as broker

    publish_many = broker.BrokerClient.publish_many

    def counted(self, session_id, experiment, samples, stop, *args, per_message=None, **kwargs):
        n = per_message or self.samples_per_message
        sent = publish_many(self, session_id, experiment, samples, stop, *args, per_message=per_message, **kwargs)
        now, left = time.monotonic(), sent
        while left > 0:
            MESSAGES.append((now, min(n, left)))
            left -= n
        return sent

    broker.BrokerClient.publish_many = counted
    count_routes(REQUESTS)


class Ledger(CpuMeter):
    """CPU of every part over the steady middle of one run (see the module docstring), per process and per thread of
    the manager; ``result`` once joined. The window and the processes are :class:`distributed.CpuMeter`'s."""

    @staticmethod
    def _processes() -> dict[str, float]:
        return {f"{kind}:{pid}": cpu for (kind, pid), cpu in CpuMeter._cpu().items()}

    @staticmethod
    def _threads() -> dict[int, tuple[str, float]]:
        names = {t.native_id: t.name for t in threading.enumerate()}
        return {t.id: (names.get(t.id, f"native-{t.id}"), t.user_time + t.system_time)
                for t in psutil.Process().threads()}

    def run(self) -> None:
        while self._done() < 0.2 * self.total:
            time.sleep(0.5)  # this thread's own CPU is left out of the manager's below
        REQUESTS.clear()
        p0, t0, m0, n0, c0 = self._processes(), self._threads(), time.monotonic(), self._done(), psutil.cpu_times()
        while self._done() < 0.8 * self.total:
            time.sleep(0.5)
        p1, t1, m1, n1, c1 = self._processes(), self._threads(), time.monotonic(), self._done(), psutil.cpu_times()
        samples, seconds = max(n1 - n0, 1), m1 - m0
        per = {k: 1000 * (v - p0[k]) / samples for k, v in p1.items() if k in p0}
        threads: collections.Counter[str] = collections.Counter()
        for tid, (name, cpu) in t1.items():
            if tid != self.native_id:
                key = "session publisher" if re.match(r"session-[0-9a-f]", name) else name.rstrip("0123456789_-")
                threads[key] += 1000 * (cpu - t0.get(tid, (name, 0.0))[1]) / samples
        per["manager:" + str(os.getpid())] -= 1000 * (t1[self.native_id][1] - t0[self.native_id][1]) / samples
        parts: collections.Counter[str] = collections.Counter()
        for key, value in per.items():
            parts[key.split(":")[0]] += value
        busy = sum(getattr(c1, f) - getattr(c0, f) for f in ("user", "system", "nice", "irq", "softirq"))
        messages = [n for t, n in MESSAGES if m0 <= t <= m1]
        self.result = {
            "samples": samples, "seconds": round(seconds, 2), "parts_ms": {k: round(v, 2) for k, v in parts.items()},
            "processes_ms": {k: round(v, 2) for k, v in per.items()},
            "manager_threads_ms": {k: round(v, 2) for k, v in threads.most_common() if v >= 0.01},
            "machine_ms": round(1000 * busy / samples, 1), "messages": len(messages),
            "samples_per_message": round(sum(messages) / len(messages), 2) if messages else None,
            "requests_per_s": {k: round(v / seconds, 2) for k, v in REQUESTS.most_common()},
            "load": [round(x, 1) for x in os.getloadavg()]}


def distributed(config, home: Path, amqp: str, arm: str) -> dict:
    """One `labswarm run --workers 2` of ``config`` over RabbitMQ with the default settings and ``arm``'s packing."""
    from distributed import drop_queue, steady_rate

    import labswarm.sessions.packing as packing
    from labswarm.run import RunOptions, run_experiment
    from labswarm.sample import iter_samples
    from labswarm.settings import Settings

    kind, value = arm.split(":")
    extra = {"samples_per_message": int(value)} if kind == "fixed" else {}
    packing.TARGET_SECONDS = float(value) if kind == "target" else packing.TARGET_SECONDS
    MESSAGES.clear()
    ledger = Ledger(home, sum(1 for _ in iter_samples(config)))
    ledger.start()
    t0 = time.perf_counter()
    try:
        result = run_experiment(config, RunOptions(workers=2, health=True),
                                settings=Settings(home=home, broker_url=amqp, **extra))
    finally:
        wall = time.perf_counter() - t0
        drop_queue(amqp, config.name)  # as bench/distributed.py's runs: no durable queue left per run
    p = result.progress
    if p["status"] != "completed" or p["failed"]:
        raise SystemExit(f"distributed run did not complete cleanly: {p} {result.failures[:3]}")
    ledger.join(10)
    return {"wall": round(wall, 2), "steady": round(steady_rate(home, p["id"])[0], 2), "ledger": ledger.result}


def local(config) -> dict:
    """The local process pool (2 processes) on ``config``: wall s, steady samples/s, its processes' CPU a sample."""
    from distributed import steady

    from labswarm.local import run_local

    finished: list[float] = []
    before, t0 = psutil.Process().cpu_times(), time.perf_counter()
    summary = run_local(config, jobs=2, on_result=lambda r: finished.append(time.time()))
    wall, after = time.perf_counter() - t0, psutil.Process().cpu_times()
    cpu = after.children_user - before.children_user + after.children_system - before.children_system
    return {"wall": round(wall, 2), "steady": round(steady(finished), 2),
            "pool_ms": round(1000 * cpu / max(summary.computed, 1), 2), "load": [round(x, 1) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30, help="clips (x 9 transformations) per run")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--arms", default="target:0.25,target:0.5", help="comma-separated target:S or fixed:N")
    parser.add_argument("--local", action="store_true", help="the local pool first in each pair")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--out", default=None, help="append each run's JSON line to this file")
    args = parser.parse_args()
    from features_local import demo_experiment

    instrument()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-packing-"))
    config_with_store = demo_experiment(Path(args.demo), args.clips, tmp)
    arms = args.arms.split(",")
    runs = []
    for pair in range(args.pairs):
        order = (["local"] if args.local else []) + (arms if pair % 2 == 0 else arms[::-1])
        for arm in order:
            slug = uuid.uuid4().hex[:6]
            config = config_with_store(slug).model_copy(update={"name": f"bench-{slug}"})
            run = {"pair": pair, "arm": arm,
                   **(local(config) if arm == "local" else distributed(config, tmp / f"home-{slug}", args.amqp, arm))}
            runs.append(run)
            print(json.dumps(run), flush=True)
            if args.out:
                with open(args.out, "a") as handle:
                    handle.write(json.dumps(run) + "\n")
    print("\n| pair | arm | steady samples/s | samples/message | CPU ms a sample: manager, worker mains, pool, beam |")
    print("|---|---|---:|---:|---|")
    for run in runs:
        ledger = run.get("ledger") or {}
        parts = ledger.get("parts_ms", {})
        cpu = ", ".join(f"{parts.get(k, 0):.2f}" for k in ("manager", "worker-main", "pool", "rabbitmq"))
        print(f"| {run['pair']} | {run['arm']} | {run['steady']:.2f} | {ledger.get('samples_per_message', '')} | "
              f"{cpu if parts else 'pool ' + str(run.get('pool_ms'))} |")


if __name__ == "__main__":
    main()
