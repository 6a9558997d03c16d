"""Benchmark: the distributed run vs the local pool vs a plain loop, RabbitMQ vs the embedded broker, and the
per-task overhead of manager + broker + worker.

    .venv/bin/python bench/distributed.py [DEMO_DIR] [--clips N] [--trivial N] [--amqp URL]

All runs compute the same samples (the demo experiment's first N clips x its 9 transformations, features mel +
MFCC) into fresh stores, in this one process run, side by side:

- plain loop: one process computing every sample the plain librosa way (bench/features_local.py), no store;
- `labswarm features --jobs 2`: the local process pool;
- `labswarm run --workers 2` over RabbitMQ, and over the embedded SQLite broker.

For the distributed runs two figures are printed: the wall time of the whole command (worker start-up included:
~1.7 s of CPU of imports and warm-up in the workers' one warm parent, started while the manager starts, which then
forks them) and the steady rate, from the first to the last outcome recorded in the ledger. The pool forks from
this process, warm since the plain loop: like it, a session on workers started and warm before the timed part (a
deployed swarm's, bench/warm_session.py) is timed from the session's start to its end.
The trivial-task run sends tiny samples (0.05-s clips, one small STFT) through the same path, at an unlimited
publish rate, to measure tasks/s and the system's wall time per task; its store is on disk (each write is
fsynced: several ms a task on a busy disk) and, to see the path's own cost, on tmpfs (/dev/shm). Beside it, the
baseline: bare Celery (no manager, no store) draining no-op tasks from RabbitMQ with 2 single-process workers.
Goals, printed in a final block (goal, measured, met?): issue 27's on real features with the default settings
(steady rate of `labswarm run` over RabbitMQ >= 0.97x the local pool's; wall time of the run, --clips 30 = 270
samples, <= 1.3x the pool's, over RabbitMQ and on the embedded default; embedded >= 0.95x RabbitMQ's steady rate with
the manager's CPU per task <= 1.5x RabbitMQ's) and on trivial tasks (>= 0.8x bare Celery's tasks/s with the default
settings, i.e. with --trivial-controlled; the embedded pair again); issue 10's <= 1.5 ms of system wall time per
trivial task through manager + RabbitMQ + 2 workers. The publish rate alone: bench/publish.py; 100,000 samples and
the manager's memory: bench/scale.py.

The last line says how long the benchmark took and the load average before and after it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: The goals measured so far in this process: (goal, measured, met?), printed by :func:`print_goals`.
GOALS: list[tuple[str, str, str]] = []


def goal(name: str, measured: float, target: float, *, unit: str = "x", at_most: bool = False,
         applies: bool = True) -> None:
    """Record a goal's figure: met when ``measured >= target`` (``<=`` with ``at_most``); ``applies=False``: the
    run did not measure what the goal names (then ``n/a``)."""
    met = (measured <= target if at_most else measured >= target) if applies else None
    shown = f"{measured:.2f}{unit}" if measured == measured else "nan"  # nan: not measured
    GOALS.append((name, shown, "n/a" if met is None else ("yes" if met else "NO")))


def print_goals(started: float, load_before: tuple[float, float, float]) -> None:
    """The final block: every goal recorded, then how long the benchmark took and the load around it."""
    print("\n## goals\n\n| goal | measured | met? |\n|---|---:|:---:|")
    for name, measured, met in GOALS:
        print(f"| {name} | {measured} | {met} |")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    before = " ".join(f"{x:.1f}" for x in load_before)
    print(f"\ntook {time.perf_counter() - started:.0f} s; load average before {before}, after {load}", flush=True)


def steady(times: list[float]) -> float:
    """Samples/s between the 10th and the 90th percentile of finish times: the steady rate, without the
    start-up of the workers and the tail of the last tasks (the same measure for every run)."""
    times = sorted(times)
    lo, hi = int(0.1 * len(times)), int(0.9 * len(times))
    return (hi - lo) / (times[hi] - times[lo]) if hi > lo and times[hi] > times[lo] else float("nan")


def steady_rate(home: Path, session_id: str) -> tuple[float, int]:
    """(steady samples/s, outcomes) from the finish times workers reported to the manager's ledger."""
    with sqlite3.connect(home / "manager.sqlite") as conn:
        rows = conn.execute(
            "SELECT finished_at FROM samples WHERE session_id = ? AND status IN ('done', 'failed')", (session_id,)
        ).fetchall()
    return steady([r[0] for r in rows if r[0] is not None]), len(rows)


class CpuMeter(threading.Thread):
    """CPU of each part during the steady middle of a run (20 % to 80 % of the outcomes), per task and per second:
    ``manager`` (this process: the manager, its publisher, the client polling progress), ``worker-main`` (the Celery
    worker processes: consumer, pool feeding, reports), ``pool`` (their pool processes: the computation),
    ``rabbitmq`` (the ``beam`` processes; with another session on the same broker, theirs too). Less sensitive to
    the load of a shared machine than wall time. ``result``: ``{part: (ms per task, ms per s)}`` and ``"rate"``:
    ``(tasks/s over the window, 0)``."""

    def __init__(self, home: Path, total: int) -> None:
        super().__init__(daemon=True)
        self.home, self.total, self.result = home, total, None

    def _done(self) -> int:
        try:
            with sqlite3.connect(self.home / "manager.sqlite", timeout=1) as conn:
                row = conn.execute("SELECT sum(coalesce(done,0)+coalesce(failed,0)+coalesce(cached,0)) FROM sessions")
                return int(row.fetchone()[0] or 0)
        except sqlite3.Error:
            return 0

    @staticmethod
    def _cpu() -> dict[tuple[str, int], float]:
        me = psutil.Process()
        procs = [("manager", me)]
        for child in me.children():
            procs.append(("worker-main", child))
            procs += [("pool", p) for p in child.children(recursive=True)]
        procs += [("rabbitmq", p) for p in psutil.process_iter(["name"]) if "beam" in (p.info["name"] or "")]
        out = {}
        for kind, p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            out[(kind, p.pid)] = t.user + t.system
        return out

    def run(self) -> None:
        while self._done() < 0.2 * self.total:
            time.sleep(0.5)  # the meter's own polling is part of "manager": keep it rare
        a, da, ta = self._cpu(), self._done(), time.monotonic()
        while self._done() < 0.8 * self.total:
            time.sleep(0.5)
        b, tasks, seconds = self._cpu(), self._done() - da, time.monotonic() - ta
        parts: dict[str, float] = {}
        for key, value in b.items():
            if key in a:
                parts[key[0]] = parts.get(key[0], 0.0) + value - a[key]
        self.result = {k: (1000 * v / max(tasks, 1), 1000 * v / max(seconds, 1e-9)) for k, v in parts.items()}
        self.result["rate"] = (tasks / max(seconds, 1e-9), 0.0)


def cpu_line(parts: dict[str, tuple[float, float]]) -> str:
    """``CpuMeter.result`` as one line: ms per task and ms per s of each part."""
    return ", ".join(f"{k} {v[0]:.1f} ms/task ({v[1]:.0f} ms/s)" for k, v in parts.items() if k != "rate")


def distributed(config, broker: str | None, home: Path, workers: int = 2, rate: float = 5000.0,
                controlled: bool = True, samples_per_message: int | None = None, meter: bool = False):
    """Run ``config`` through ``labswarm run``'s machinery; returns (wall s, steady samples/s, progress), and
    with ``meter`` the CPU ms per task of each part (:class:`CpuMeter`) as a fourth item.

    ``controlled=False``: no health controller and no start window, the publisher goes flat out at ``rate``: the
    steady rate is then what the path (publisher, broker, workers, reports) can carry, not what a controller chose.
    ``samples_per_message``: the setting of the same name (samples per task message); ``None``: the default
    (each session's publisher chooses from the task time).
    """
    from labswarm.run import RunOptions, run_experiment
    from labswarm.sample import iter_samples
    from labswarm.settings import Settings

    extra = {} if controlled or "start_window" not in Settings.model_fields else {"start_window": 10**9}
    if samples_per_message is not None:
        extra["samples_per_message"] = samples_per_message
    settings = Settings(home=home, broker_url=broker, default_rate=rate, **extra)
    cpu = CpuMeter(home, sum(1 for _ in iter_samples(config))) if meter else None
    if cpu is not None:
        cpu.start()
    t0 = time.perf_counter()
    try:
        result = run_experiment(config, RunOptions(workers=workers, health=controlled), settings=settings)  # as the CLI
    finally:
        wall = time.perf_counter() - t0
        drop_queue(broker, config.name)
    p = result.progress
    if p["status"] != "completed" or p["failed"]:
        raise SystemExit(f"distributed run did not complete cleanly: {p} {result.failures[:3]}")
    rate_, _ = steady_rate(home, p["id"])
    if cpu is not None:
        cpu.join(5)
        return wall, rate_, p, cpu.result or {}
    return wall, rate_, p


def drop_queue(broker: str | None, experiment: str) -> None:
    """Delete a benchmark run's RabbitMQ queue once the run ended, if empty and unused (RabbitMQ checks both;
    :func:`labswarm.queue.cleanup.delete_if_idle`); nothing for the embedded broker (its queues are rows of a file in
    the run's home). A broker keeps each run's durable queue otherwise (the manager deletes one an hour after its
    experiment's last session, which a benchmark's run never lives to see): 373 had piled up on the project's broker
    by the eighth session, and RabbitMQ spent 3-13 ms of CPU a second on them idle, on the cores later runs measure.
    A failure to delete is left alone: the run's figures stand."""
    from labswarm.queue.app import make_celery
    from labswarm.queue.cleanup import delete_if_idle
    from labswarm.queue.names import is_embedded

    if not broker or is_embedded(broker):
        return
    with contextlib.suppress(Exception):
        delete_if_idle(make_celery(broker), experiment)


def trivial_experiment(tmp: Path, n_clips: int):
    """Tiny clips x 5 gain variants, one small STFT: ~0.3 ms of compute per task."""
    from labswarm.config.experiment import parse_experiment

    data = tmp / "trivial"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = ["path,label"]
    for i in range(n_clips):
        sf.write(data / f"c{i}.wav", (0.1 * rng.standard_normal(1102)).astype(np.float32), 22050)
        rows.append(f"c{i}.wav,x")
    (data / "labels.csv").write_text("\n".join(rows) + "\n")
    return parse_experiment({
        "name": "trivial", "dataset": {"root": str(data), "segment": {"start": 0.0, "duration": 0.05}},
        "transformations": [{"name": "gain", "gain_db": g} for g in (-6, -3, 0, 3, 6)],
        "features": [{"name": "stft", "n_fft": 256, "hop_length": 128}],
        "store": {"root": str(tmp / "store-trivial")},
    })


NOOP_APP = """
from labswarm.queue.app import make_celery
app = make_celery({url!r})
@app.task(name="bench.noop", acks_late=True, ignore_result=True)
def noop(i):
    return i
"""


def _cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(CPU s of the processes ``pids`` and all their descendants, CPU s of RabbitMQ's ``beam`` processes)."""
    own = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                own += t.user + t.system
        except psutil.Error:
            continue
    beam = 0.0
    for p in psutil.process_iter(["name"]):
        if "beam" in (p.info["name"] or ""):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                beam += t.user + t.system
    return own, beam


def bare_celery(url: str, tmp: Path, n: int = 3000) -> tuple[float, dict[str, float]]:
    """No-op tasks/s of bare Celery: 2 ``celery worker -c 1`` (labswarm's Celery settings) draining ``n``
    pre-published persistent messages; timed from 90 % to 10 % of the queue left. Also its CPU ms per task over
    that window, ``{"workers": ..., "rabbitmq": ...}``: beside labswarm's (:class:`CpuMeter`) it tells whether a
    run short of bare Celery's rate spends more CPU per task or leaves the cores idle (with another session on
    the same broker, RabbitMQ's figure counts its messages too)."""
    from kombu import Connection, Queue

    from labswarm.queue.app import make_celery

    folder = tmp / "noop"
    folder.mkdir(exist_ok=True)
    (folder / "noopapp.py").write_text(NOOP_APP.format(url=url))
    app, name = make_celery(url), f"bench-noop-{uuid.uuid4().hex[:6]}"
    with app.connection_for_write() as conn, conn.Producer() as producer:
        for i in range(n):
            m = app.amqp.as_task_v2(str(uuid.uuid4()), "bench.noop", args=(i,))
            producer.publish(m.body, routing_key=name, headers=m.headers, serializer="json", delivery_mode=2,
                             declare=[Queue(name, durable=True)], **m.properties)
    env = dict(os.environ, PYTHONPATH=f"{folder}{os.pathsep}{ROOT}")
    workers = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "noopapp", "worker", "-Q", name, "-c", "1",
                                 "-P", "prefork", "-n", f"noop{k}-{name}@bench", "--without-gossip",
                                 "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
                                cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for k in range(2)]
    try:
        with Connection(url) as conn:
            channel = conn.default_channel

            def depth() -> int:
                return channel.queue_declare(name, passive=True).message_count

            while depth() > 0.9 * n:
                time.sleep(0.01)
            cpu0, left0, t0 = _cpu_seconds([w.pid for w in workers]), depth(), time.perf_counter()
            while depth() > 0.1 * n:
                time.sleep(0.01)
            cpu1, drained = _cpu_seconds([w.pid for w in workers]), left0 - depth()
            rate = drained / (time.perf_counter() - t0)
            channel.queue_delete(name)  # the consumers cancelled: the workers' warm shutdown is prompt
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)
        # and again once they are gone: a worker whose consumer was cancelled declared the queue again, and
        # messages stayed on the broker for good (270 and 1,863 left in two such queues on this machine's)
        with Connection(url) as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_delete(name)
    per_task = {part: 1000 * (cpu1[i] - cpu0[i]) / max(drained, 1) for i, part in enumerate(("workers", "rabbitmq"))}
    return rate, per_task


def compile_labswarm() -> str:
    """labswarm's own modules compiled to bytecode beforehand (``compileall``, into their ``__pycache__``) when this
    interpreter writes none (``PYTHONDONTWRITEBYTECODE``, as in this project's workplace shells): an installed
    labswarm has them (pip compiles a wheel's modules), but an editable checkout under that variable compiles
    ~150 of its modules from source again in every process, ~0.1 s of CPU in a worker's warm parent and ~0.25 s
    in the manager's start, both before a cold run's first task (issue 27). The pool's timed part imports nothing.
    Returns the line the benchmark prints about it."""
    import compileall

    if not sys.dont_write_bytecode:
        return "bytecode: written by the interpreter as modules are imported"
    compileall.compile_dir(str(ROOT / "labswarm"), quiet=1)
    return "bytecode: labswarm's modules compiled first (PYTHONDONTWRITEBYTECODE is set; --no-compile: not)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30, help="clips (x 9 transformations) per timed run")
    parser.add_argument("--trivial", type=int, default=400, help="tiny clips (x 5) of the overhead run")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--trivial-only", action="store_true", help="only the trivial-task runs")
    parser.add_argument("--real-only", action="store_true", help="only the real-features runs")
    parser.add_argument("--samples-per-message", default="auto,1,8",
                        help="comma-separated values of samples_per_message for the trivial-task runs (auto: the "
                        "default, chosen by the publisher)")
    parser.add_argument("--no-embedded", action="store_true", help="skip the trivial run on the embedded broker")
    parser.add_argument("--trivial-controlled", action="store_true",
                        help="trivial runs with the default settings (start window, health controller) instead of "
                        "flat out: flat out publishes every sample before any task time is measured (one a message)")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not compile labswarm's modules to bytecode first (see compile_labswarm)")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    print("bytecode: not compiled first (--no-compile)" if args.no_compile else compile_labswarm(), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-dist-"))
    if not args.trivial_only:
        real_features(args, tmp)
    if not args.real_only:
        trivial_tasks(args, tmp)
    print_goals(started, load_before)


def real_features(args: argparse.Namespace, tmp: Path) -> None:
    """Real features: plain loop, local pool, and `labswarm run` (RabbitMQ, embedded), side by side."""
    from features_local import demo_experiment, plain_compute
    from warm_session import warm_session

    from labswarm.local import run_local
    from labswarm.sample import iter_samples

    config_with_store = demo_experiment(Path(args.demo), args.clips, tmp)
    config = config_with_store("warmup")
    samples = list(iter_samples(config))
    n = len(samples)
    print(f"{n // len(config.transformations)} clips x {len(config.transformations)} transformations = {n} samples",
          flush=True)
    mel, mfcc = (f.model_dump() for f in config.features)
    for s in samples[: len(config.transformations)]:
        plain_compute(s.to_dict(), mel, mfcc)

    t0 = time.perf_counter()
    for s in samples:
        plain_compute(s.to_dict(), mel, mfcc)
    plain = time.perf_counter() - t0
    print(f"plain loop: {plain:.1f} s", flush=True)

    finished: list[float] = []
    before = psutil.Process().cpu_times()
    t0 = time.perf_counter()
    summary = run_local(config_with_store("local"), jobs=2, on_result=lambda r: finished.append(time.time()))
    local = time.perf_counter() - t0
    local_steady = steady(finished)
    assert summary.computed == n, summary.failures[:3]
    after = psutil.Process().cpu_times()
    fields = ("user", "system", "children_user", "children_system")
    local_cpu = sum(getattr(after, f) - getattr(before, f) for f in fields)
    print(f"local pool (2): {local:.1f} s wall, {local_steady:.2f} samples/s steady; CPU {1000 * local_cpu / n:.1f} "
          "ms/sample over the whole run (pool start included)", flush=True)

    runs: list[tuple[str, str | None, bool, int | None]] = [  # None: samples per message chosen (the default)
        ("labswarm run --workers 2, RabbitMQ", args.amqp, True, None),
        ("RabbitMQ, flat out (no controller)", args.amqp, False, None),
        ("RabbitMQ, flat out, 1 sample/message", args.amqp, False, 1),
        ("RabbitMQ, flat out, 8 samples/message", args.amqp, False, 8),
        ("labswarm run --workers 2, embedded", None, True, None)]
    rows = []
    for label, broker, controlled, per_message in runs:
        slug = uuid.uuid4().hex[:6]
        wall, rate, _, cpu = distributed(config_with_store(slug).model_copy(update={"name": f"bench-{slug}"}), broker,
                                         tmp / f"home-{slug}", controlled=controlled, samples_per_message=per_message,
                                         meter=True)
        rows.append((label, wall, rate, cpu.get("manager", (float("nan"), 0.0))[0]))
        print(f"{label}: {wall:.1f} s wall, {rate:.2f} samples/s steady; CPU {cpu_line(cpu)}", flush=True)

    # like the pool (forked from this warm process): the workers started and warm before the timed part, as a
    # deployed swarm's; timed from the session's start to its end (bench/warm_session.py)
    slug = uuid.uuid4().hex[:6]
    warm_wall, warm_rate, _ = warm_session(config_with_store(slug).model_copy(update={"name": f"bench-{slug}"}),
                                           args.amqp, tmp / f"home-{slug}")
    drop_queue(args.amqp, f"bench-{slug}")
    print(f"session on warm workers, RabbitMQ: {warm_wall:.1f} s from its start to its end, {warm_rate:.2f} "
          "samples/s steady", flush=True)

    plain_rate, local_rate = n / plain, local_steady
    print("\n| run | wall s | steady samples/s | vs plain loop | vs local pool |")
    print("|---|---:|---:|---:|---:|")
    print(f"| plain loop | {plain:.1f} | {plain_rate:.2f} | 1.00x | {plain_rate / local_rate:.2f}x |")
    print(f"| labswarm features --jobs 2 | {local:.1f} | {local_rate:.2f} | {local_rate / plain_rate:.2f}x | 1.00x |")
    for name, wall, rate, _ in rows:
        print(f"| {name} | {wall:.1f} | {rate:.2f} | {rate / plain_rate:.2f}x | {rate / local_rate:.2f}x |")
    print(f"| session on warm workers, RabbitMQ (timed from the session's start) | {warm_wall:.1f} | {warm_rate:.2f} | "
          f"{warm_rate / plain_rate:.2f}x | {warm_rate / local_rate:.2f}x |")
    (_, rmq_wall, rmq_rate, rmq_cpu), (_, emb_wall, emb_rate, emb_cpu) = rows[0], rows[-1]
    print(f"\nembedded broker vs RabbitMQ (steady rate): {emb_rate / rmq_rate:.2f}x")
    print(f"\ndistributed (RabbitMQ) vs local pool, steady rate: {rmq_rate / local_rate:.2f}x (goal >= 0.97x)",
          flush=True)
    real = f"real features, {n} samples, default settings"
    goal(f"issue 27: steady rate, labswarm run over RabbitMQ / local pool, {real} (>= 0.97x)",
         rmq_rate / local_rate, 0.97)
    goal(f"issue 27: wall time, labswarm run over RabbitMQ / local pool, {real} (<= 1.3x; 270 samples: --clips 30)",
         rmq_wall / local, 1.3, at_most=True)
    goal(f"issue 27: wall time, labswarm run embedded (the default) / local pool, {real} (<= 1.3x)",
         emb_wall / local, 1.3, at_most=True)
    goal(f"issue 27: wall time, a session on warm workers over RabbitMQ (started before, as the pool's warm parent) "
         f"/ local pool, {real} (<= 1.3x)", warm_wall / local, 1.3, at_most=True)
    goal(f"issue 27: steady rate, embedded / RabbitMQ, {real} (>= 0.95x)", emb_rate / rmq_rate, 0.95)
    goal(f"issue 27: manager CPU per task, embedded / RabbitMQ, {real} (<= 1.5x)", emb_cpu / rmq_cpu, 1.5,
         at_most=True)



def trivial_tasks(args: argparse.Namespace, tmp: Path) -> None:
    """Trivial tasks through manager + broker + 2 workers, flat out, beside bare Celery."""
    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sample import iter_samples

    shm = Path(tempfile.mkdtemp(prefix="labswarm-bench-shm-", dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp
    trivial = trivial_experiment(tmp, args.trivial)
    tb = FeaturesBlock(trivial)
    ts = list(iter_samples(trivial))
    for s in ts[:20]:  # warm up (first calls of the audio libraries)
        tb.compute(s)
    t0 = time.perf_counter()
    for s in ts:
        tb.compute(s)
    compute_ms = 1000 * (time.perf_counter() - t0) / len(ts)
    bare, bare_cpu = bare_celery(args.amqp, tmp)
    print(f"\nbare Celery, no-op tasks, RabbitMQ + 2 workers: {bare:.0f} tasks/s = {1000 / bare:.2f} ms per task; CPU "
          f"ms/task: workers {bare_cpu['workers']:.2f}, RabbitMQ {bare_cpu['rabbitmq']:.2f} = "
          f"{sum(bare_cpu.values()):.2f} (labswarm's below: less CPU per task at a lower rate means idle cores)",
          flush=True)
    print("\n| trivial tasks, 2 workers | samples/message | tasks/s steady | ms of system wall time per task | "
          "vs bare Celery | CPU ms/task: manager, workers, RabbitMQ = total |")
    print("|---|---:|---:|---:|---:|---|")
    print(f"| bare Celery no-op (baseline) | 1 | {bare:.0f} | {1000 / bare:.2f} | 1.00x | "
          f"-, {bare_cpu['workers']:.2f}, {bare_cpu['rabbitmq']:.2f} = {sum(bare_cpu.values()):.2f} |")
    runs = [(f"RabbitMQ, store on {where}", args.amqp, store, n)
            for n in (None if v == "auto" else int(v) for v in args.samples_per_message.split(","))
            for where, store in (("disk", tmp), ("tmpfs", shm))]
    if not args.no_embedded:
        runs.append(("embedded, store on disk", None, tmp, None))
    measured = {}
    for label, broker, store, per_message in runs:
        slug = uuid.uuid4().hex[:6]
        cfg = trivial.model_copy(update={
            "name": f"trivial-{slug}", "store": trivial.store.model_copy(update={"root": store / f"store-{slug}"})})
        _, rate, _, cpu = distributed(cfg, broker, tmp / f"home-trivial-{slug}", rate=100_000.0,
                                      controlled=args.trivial_controlled, samples_per_message=per_message, meter=True)
        ms = {k: v[0] for k, v in cpu.items() if k != "rate"}
        ms["workers"] = ms.pop("worker-main", 0.0) + ms.pop("pool", 0.0)
        parts = ", ".join(f"{ms.get(k, 0.0):.2f}" for k in ("manager", "workers", "rabbitmq"))
        print(f"| {label} | {per_message or 'auto'} | {rate:.0f} | {1000 / rate:.2f} | {rate / bare:.2f}x | "
              f"{parts} = {sum(ms.values()):.2f} |", flush=True)
        measured.setdefault((label, per_message), (rate, ms.get("manager", float("nan"))))
    print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"\ncompute alone (no store): {compute_ms:.2f} ms per task; goal: <= 1.5 ms of system wall time per task")
    trivial_goals(measured, bare, len(ts), args.trivial_controlled)


def trivial_goals(measured: dict[tuple[str, int | None], tuple[float, float]], bare: float, n: int,
                  controlled: bool) -> None:
    """The trivial runs' goals, from ``measured``: ``(label, samples per message) -> (tasks/s, manager CPU ms per
    task)``; those of the default settings apply only to ``controlled`` runs (--trivial-controlled)."""
    how = "default settings" if controlled else "flat out: not the default settings, see --trivial-controlled"
    rmq = measured.get(("RabbitMQ, store on disk", None))
    if rmq is None:
        return
    goal(f"issue 27: trivial tasks/s, RabbitMQ, store on disk / bare Celery, {n} samples, {how} (>= 0.8x; "
         "100,000 samples: bench/scale.py)", rmq[0] / bare, 0.8, applies=controlled)
    goal("issue 10: system wall time per trivial task, RabbitMQ, store on disk (<= 1.5 ms)", 1000 / rmq[0], 1.5,
         unit=" ms", at_most=True)
    embedded = measured.get(("embedded, store on disk", None))
    if embedded is not None:
        goal(f"issue 27: trivial tasks/s, embedded / RabbitMQ, store on disk, {how} (>= 0.95x)", embedded[0] / rmq[0],
             0.95, applies=controlled)
        goal(f"issue 27: manager CPU per trivial task, embedded / RabbitMQ, {how} (<= 1.5x)", embedded[1] / rmq[1],
             1.5, at_most=True, applies=controlled)

if __name__ == "__main__":
    main()
