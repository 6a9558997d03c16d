"""Benchmark: where the distributed run's steady rate goes against the local pool's, process by process (issue 27).

    .venv/bin/python bench/steady_cpu.py [DEMO_DIR] [--clips 30] [--pairs 2] [--baseline REF]

Each pair runs, in this order, the local process pool (`labswarm features --jobs 2`) and `labswarm run --workers
2` over RabbitMQ with the default settings, on the same samples (bench/features_local.py's demo experiment) and
fresh stores; each run in a fresh child process warmed up first (FeaturesBlock.warm_up: the pool forks from it,
as bench/distributed.py's pool forks from its warm process). ``--baseline REF`` adds the same two runs on the code
of git revision REF (exported to a temporary folder, first on the child's ``PYTHONPATH``; the child runs outside
the repository so that the workers' ``python -m`` finds the same code), the trees alternating pair by pair;
``--tree REV`` measures revision REV instead of the working tree (which other work in progress may change).

Over the steady middle of each run (from 20 % to 80 % of the outcomes; the samples counted by their own finish
times, not by outcome reports that arrive a message at a time), per sample:

- ``pool`` CPU ms (user + system) of the processes that compute (the local pool's, the workers' pool processes),
  and of it ``side``: their threads other than the main one (a worker's outcome reporter);
- the same processes' time ``on`` a CPU, ``queued`` for one (runnable, another process on the core) and
  ``asleep`` (waiting for work: the next message, a sync), from ``/proc/<pid>/schedstat``: on an idle machine a
  pool that keeps both cores busy has ``asleep`` near 0;
- CPU ms of everything else that shares the cores: this process (the local pool's parent, or `labswarm run`'s
  manager, by thread), the workers' main processes, RabbitMQ (``beam``; its own idle baseline included);
- wakeups a second (voluntary context switches of every thread of those processes) and the manager's HTTP
  requests a second by route.

The figure that decides issue 27's steady goal is bench/distributed.py's ratio (steady rate of `labswarm run` over
RabbitMQ / the local pool's, >= 0.97x); this one says why it is what it is. On a shared machine compare CPU ms and
``asleep`` within a pair, not the rates.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
REQUESTS: collections.Counter[str] = collections.Counter()


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid`` (0 when it is gone)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as handle:
                total += sum(int(line.split()[1]) for line in handle if line.startswith("voluntary_ctxt_switches"))
        except OSError:
            continue
    return total


def pool_figures(p: psutil.Process) -> dict[str, float]:
    """CPU (s), side threads' CPU (s), schedstat's on-CPU and queued (s), minor faults of one pool process."""
    t = p.cpu_times()
    side = sum(th.user_time + th.system_time for th in p.threads() if th.id != p.pid)
    with open(f"/proc/{p.pid}/schedstat") as handle:
        on_ns, queued_ns, _ = map(int, handle.read().split())
    with open(f"/proc/{p.pid}/stat") as handle:
        minflt = int(handle.read().rsplit(")", 1)[1].split()[7])
    return {"cpu": t.user + t.system, "side": side, "on": on_ns / 1e9, "queued": queued_ns / 1e9,
            "wall": time.monotonic(), "minflt": minflt}


class Meter(threading.Thread):
    """The figures of the module docstring over the window of 20 % to 80 % of ``total`` outcomes (``done()``)."""

    def __init__(self, total: int, done, local: bool) -> None:
        super().__init__(daemon=True)
        self.total, self.done, self.local, self.result = total, done, local, None
        self.window: tuple[float, float] = (0.0, 0.0)  # wall times (time.time()) of the window's ends

    def pools(self) -> list[psutil.Process]:
        me = psutil.Process()
        if self.local:
            return me.children()
        return [p for p in me.children(recursive=True) if not p.children()]  # workers' pool processes: the leaves

    def snapshot(self) -> dict:
        me = psutil.Process()
        names = {t.native_id: t.name for t in threading.enumerate()}
        threads: collections.Counter[str] = collections.Counter()
        for t in me.threads():
            if t.id != self.native_id:
                name = names.get(t.id, "native")
                threads[re.sub(r"[-_0-9a-f]+$", "", "session publisher" if name.startswith("session-") else name)] \
                    += t.user_time + t.system_time
        mains = [] if self.local else [p for p in me.children(recursive=True) if p.children()]
        beam = [p for p in psutil.process_iter(["name"]) if "beam" in (p.info["name"] or "")]
        pools = {}
        for p in self.pools():
            try:
                pools[p.pid] = pool_figures(p)
            except (psutil.Error, OSError):
                continue

        def cpu(procs: list[psutil.Process]) -> float:
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    continue
            return total

        return {"pools": pools, "threads": threads, "this": sum(threads.values()), "mains": cpu(mains),
                "beam": cpu(beam), "wake": {"this": wakeups(me.pid), "mains": sum(wakeups(p.pid) for p in mains),
                                            "pools": sum(wakeups(pid) for pid in pools),
                                            "beam": sum(wakeups(p.pid) for p in beam)},
                "t": time.monotonic(), "wall": time.time()}

    def run(self) -> None:
        while self.done() < 0.2 * self.total:
            time.sleep(0.05)
        a = self.snapshot()
        REQUESTS.clear()
        while self.done() < 0.8 * self.total:
            time.sleep(0.05)
        b = self.snapshot()
        self.window = (a["wall"], b["wall"])
        self.result = (a, b, dict(REQUESTS))


def figures(a: dict, b: dict, requests: dict, samples: int) -> dict:
    """Per-sample figures of the window between snapshots ``a`` and ``b`` in which ``samples`` finished."""
    n, seconds = max(samples, 1), b["t"] - a["t"]
    pool: collections.Counter[str] = collections.Counter()
    for pid, after in b["pools"].items():
        before = a["pools"].get(pid)
        if before is not None:
            for key in after:
                pool[key] += after[key] - before[key]
    ms = {"pool": pool["cpu"], "side": pool["side"], "on": pool["on"], "queued": pool["queued"],
          "asleep": pool["wall"] - pool["on"] - pool["queued"], "this": b["this"] - a["this"],
          "mains": b["mains"] - a["mains"], "beam": b["beam"] - a["beam"]}
    return {"samples": samples, "seconds": round(seconds, 2),
            "ms": {k: round(1000 * v / n, 2) for k, v in ms.items()},
            "minflt": round(pool["minflt"] / n, 1),
            "threads_ms": {k: round(1000 * (v - a["threads"].get(k, 0.0)) / n, 2) for k, v in b["threads"].items()
                           if v - a["threads"].get(k, 0.0) > 0.00001 * n},
            "wakeups_s": {k: round((v - a["wake"][k]) / max(seconds, 1e-9), 1) for k, v in b["wake"].items()},
            "requests_s": {k: round(v / max(seconds, 1e-9), 2) for k, v in sorted(requests.items())}}


def count_routes(requests: collections.Counter[str] = REQUESTS) -> None:
    """Count the manager's HTTP requests by route into ``requests`` ("METHOD /route" -> requests; an ASGI wrapper
    around every app ``create_app`` builds from now on, no behaviour change). Also bench/packing_ab.py's."""
    import labswarm.manager.api as api

    create_app = api.create_app

    class Count:
        def __init__(self, app) -> None:
            self.app = app

        async def __call__(self, scope, receive, send) -> None:
            if scope["type"] == "http":
                requests[f"{scope['method']} {re.sub(r'/[0-9a-f]{8,}', '/{id}', scope['path'])}"] += 1
            await self.app(scope, receive, send)

    def counting_app(*args, **kwargs):
        app = create_app(*args, **kwargs)
        app.add_middleware(Count)
        return app

    api.create_app = counting_app


def one_run(arm: str, demo: Path, clips: int, amqp: str) -> dict:
    """One run of ``arm`` (``local`` or ``run``) in this process, warmed up first; its figures."""
    sys.path.insert(0, str(ROOT / "bench"))
    from distributed import drop_queue, steady
    from features_local import demo_experiment

    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sample import iter_samples

    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-steady-"))
    config_with_store = demo_experiment(demo, clips, tmp)
    FeaturesBlock(config_with_store("warm")).warm_up()  # the pool forks from a warm process
    slug = uuid.uuid4().hex[:6]
    config = config_with_store(slug).model_copy(update={"name": f"bench-{slug}"})
    total = sum(1 for _ in iter_samples(config))
    if arm == "local":
        from labswarm.local import run_local

        finished: list[float] = []
        meter = Meter(total, lambda: len(finished), local=True)
        meter.start()
        run_local(config, jobs=2, on_result=lambda r: finished.append(time.time()))
    else:
        from labswarm.run import RunOptions, run_experiment
        from labswarm.settings import Settings

        count_routes()
        home = tmp / "home"

        def done() -> int:
            try:
                with sqlite3.connect(home / "manager.sqlite", timeout=1) as conn:
                    row = conn.execute("SELECT sum(coalesce(done,0)+coalesce(failed,0)+coalesce(cached,0)) "
                                       "FROM sessions").fetchone()
                    return int(row[0] or 0)
            except sqlite3.Error:
                return 0

        meter = Meter(total, done, local=False)
        meter.start()
        try:
            result = run_experiment(config, RunOptions(workers=2), settings=Settings(home=home, broker_url=amqp))
        finally:
            drop_queue(amqp, config.name)
        if result.progress["status"] != "completed" or result.progress["failed"]:
            raise SystemExit(f"the run did not complete cleanly: {result.progress}")
        with sqlite3.connect(home / "manager.sqlite") as conn:
            finished = [r[0] for r in conn.execute("SELECT finished_at FROM samples WHERE session_id = ?",
                                                   (result.progress["id"],)) if r[0] is not None]
    meter.join(60)
    if meter.result is None:
        raise SystemExit("the meter saw no steady window")
    lo, hi = meter.window
    a, b, requests = meter.result
    return {"arm": arm, "steady": round(steady(finished), 2),
            **figures(a, b, requests, sum(1 for t in finished if lo <= t <= hi)),
            "load": round(os.getloadavg()[0], 1)}


def export(ref: str) -> Path:
    """The tree of git revision ``ref`` in a temporary folder."""
    out = Path(tempfile.mkdtemp(prefix="labswarm-bench-tree-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref], check=True,
                             capture_output=True).stdout
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(out, filter="data")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30, help="clips (x 9 transformations) per run")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--baseline", default=None, help="git revision measured beside the tree")
    parser.add_argument("--tree", default=None, help="git revision measured (default: the working tree)")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--one", choices=("local", "run"), help=argparse.SUPPRESS)  # a child's single run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, Path(args.demo), args.clips, args.amqp)), flush=True)
        return
    trees = [(args.tree or "tree", export(args.tree) if args.tree else ROOT)]
    trees += [(args.baseline, export(args.baseline))] if args.baseline else []
    cwd = Path(tempfile.mkdtemp(prefix="labswarm-bench-steady-cwd-"))  # not the repository: see the docstring
    runs = []
    for pair in range(args.pairs):
        for label, tree in (trees if pair % 2 == 0 else trees[::-1]):
            for arm in ("local", "run"):
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(Path(args.demo).resolve()),
                                      "--clips", str(args.clips), "--amqp", args.amqp, "--one", arm],
                                     cwd=cwd, env=env, capture_output=True, text=True, check=False)
                lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
                if out.returncode or not lines:
                    raise SystemExit(f"{label} {arm} failed: {out.stderr[-2000:]}")
                run = {"pair": pair, "tree": label, **json.loads(lines[-1])}
                runs.append(run)
                print(json.dumps(run), flush=True)
    print("\n| pair | tree | run | steady samples/s | pool CPU ms (side) | on / queued / asleep ms | this | worker "
          "mains | beam | wakeups/s | requests/s |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in runs:
        ms = r["ms"]
        print(f"| {r['pair']} | {r['tree']} | {r['arm']} | {r['steady']:.2f} | {ms['pool']:.2f} ({ms['side']:.2f}) | "
              f"{ms['on']:.1f} / {ms['queued']:.1f} / {ms['asleep']:.2f} | {ms['this']:.2f} | {ms['mains']:.2f} | "
              f"{ms['beam']:.2f} | {sum(r['wakeups_s'].values()):.0f} | {sum(r['requests_s'].values()):.1f} |")


if __name__ == "__main__":
    main()
