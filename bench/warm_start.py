"""Benchmark: the start of a run's workers, each a fresh interpreter (the default) vs forked from one warm parent
(``LocalLauncher(warm=True)``, labswarm/deploy/warm.py), side by side in one process (issue 27, item 2).

    .venv/bin/python bench/warm_start.py [--rounds 3] [--workers 2] [--clips 8] [--runs]

One embedded manager (SQLite state and broker, as ``labswarm run``'s default) serves every session. Each round
runs three sessions of the same small experiment (``--clips`` 10-s tones x identity + pitch shift, mel + MFCC),
each under a fresh name and store, in an order that rotates between rounds:

- ``spawn``: ``--workers`` workers started as ``python -m labswarm.cli worker`` (the default);
- ``fork, cold``: forked from the warm parent, started anew for this session (its preload's imports and warm-up
  are in the time: the first session of a ``labswarm run``);
- ``fork, warm``: forked from the warm parent the previous session left running (later sessions of a manager).

Measured from ``launcher.start()`` (the session already publishing): the time to the first outcome in the ledger
and to the last, and the CPU of the launcher's descendants. Printed: each session, then the medians and the ratios
to ``spawn``, and how long the benchmark took.

With ``--runs``: whole ``labswarm run``s instead (``run_experiment``: the embedded manager's start included),
``RunOptions(warm=False)`` vs ``warm=True`` (the warm parent started first thing, its preload overlapping the
manager's start; stopped between runs, as each ``labswarm run`` is a new process), alternating; measured from the
call: the first outcome (progress polled every 0.1 s) and the end.
"""

from __future__ import annotations

import argparse
import multiprocessing.forkserver
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import experiment_dict, write_tone_set  # noqa: E402

from labswarm.client import ManagerClient  # noqa: E402
from labswarm.deploy.local import LocalLauncher  # noqa: E402
from labswarm.manager.api import create_app  # noqa: E402
from labswarm.manager.server import EmbeddedServer  # noqa: E402
from labswarm.settings import Settings  # noqa: E402

MODES = ("spawn", "fork, cold", "fork, warm")


def descendants_cpu() -> float:
    """CPU seconds (user + system) of this process's live descendants: the workers, their pools, the forkserver."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def one_session(client: ManagerClient, url: str, tmp: Path, data: Path, mode: str, workers: int) -> dict[str, float]:
    name = f"warm-{uuid.uuid4().hex[:6]}"
    config = experiment_dict(data, tmp / f"store-{name}", name=name,
                             dataset={"root": str(data), "sample_rate": 22050,
                                      "segment": {"start": 0.0, "duration": 10.0}},
                             transformations=[{"name": "identity"}, {"name": "pitch_shift", "semitones": 2}],
                             features=[{"name": "mel", "n_mels": 128}, {"name": "mfcc", "n_mfcc": 20}])
    client.post_experiment(config)
    if mode == "fork, cold":
        multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]  # its preload runs again
    session = client.start_session(name)
    launcher = LocalLauncher(name, url, warm=mode != "spawn", log_dir=tmp / "logs", log_name=name)
    cpu0 = descendants_cpu()
    t0 = time.perf_counter()
    launcher.start(workers)
    first = None
    try:
        while True:
            progress = client.session(session["id"])
            if first is None and progress["finished"]:
                first = time.perf_counter() - t0
            if progress["status"] in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.05)
        last = time.perf_counter() - t0
        cpu = descendants_cpu() - cpu0
    finally:
        launcher.stop(timeout=30)
    if progress["status"] != "completed" or progress["failed"]:
        raise SystemExit(f"{mode}: the session did not complete cleanly: {progress}")
    return {"first": first or last, "last": last, "cpu": cpu}


def one_run(tmp: Path, data: Path, warm: bool, workers: int) -> dict[str, float]:
    from labswarm.config.experiment import parse_experiment
    from labswarm.run import RunHooks, RunOptions, run_experiment

    name = f"run-{uuid.uuid4().hex[:6]}"
    config = parse_experiment(experiment_dict(
        data, tmp / f"store-{name}", name=name,
        dataset={"root": str(data), "sample_rate": 22050, "segment": {"start": 0.0, "duration": 10.0}},
        transformations=[{"name": "identity"}, {"name": "pitch_shift", "semitones": 2}],
        features=[{"name": "mel", "n_mels": 128}, {"name": "mfcc", "n_mfcc": 20}]))
    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]  # as in a new process
    t0, first = time.perf_counter(), []

    class Hooks(RunHooks):
        def on_progress(self, progress: dict) -> None:
            if progress["finished"] and not first:
                first.append(time.perf_counter() - t0)

    settings = Settings(home=tmp / f"home-{name}", data_roots=[str(tmp)])
    result = run_experiment(config, RunOptions(workers=workers, health=False, poll=0.1, warm=warm),
                            settings=settings, hooks=Hooks())
    last = time.perf_counter() - t0
    if result.progress["status"] != "completed" or result.progress["failed"]:
        raise SystemExit(f"warm={warm}: the run did not complete cleanly: {result.progress}")
    return {"first": first[0] if first else last, "last": last}


def runs(args: argparse.Namespace, tmp: Path, data: Path) -> None:
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for warm in ((False, True) if r % 2 == 0 else (True, False)):
            m = one_run(tmp, data, warm, args.workers)
            results[warm].append(m)
            print(f"round {r + 1}, warm={warm}: first outcome {m['first']:.2f} s, end {m['last']:.2f} s; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    base = {k: statistics.median(m[k] for m in results[False]) for k in ("first", "last")}
    print(f"\n| labswarm run, {args.workers} workers, {2 * args.clips} samples | first outcome s | vs spawn | "
          "end s | vs spawn |\n|---|---:|---:|---:|---:|")
    for warm in (False, True):
        med = {k: statistics.median(m[k] for m in results[warm]) for k in ("first", "last")}
        print(f"| {'warm parent' if warm else 'spawn (default)'} (median of {len(results[warm])}) | "
              f"{med['first']:.2f} | {med['first'] / base['first']:.2f}x | {med['last']:.2f} | "
              f"{med['last'] / base['last']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clips", type=int, default=8, help="10-s tones (x 2 transformations)")
    parser.add_argument("--runs", action="store_true", help="whole labswarm runs, warm=False vs warm=True")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-warm-"))
    data = write_tone_set(tmp / "data", tones=args.clips)
    if args.runs:
        runs(args, tmp, data)
        print(f"\ntook {time.perf_counter() - started:.0f} s; load average before "
              f"{' '.join(f'{x:.1f}' for x in load_before)}, after {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        return
    server = EmbeddedServer(create_app(Settings(home=tmp / "home", data_roots=[str(tmp)]))).start()
    client = ManagerClient(server.url)
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    try:
        for r in range(args.rounds):
            order = list(MODES[r % 3:] + MODES[:r % 3])  # "fork, warm" first: the forkserver of the round before
            for mode in order:
                m = one_session(client, server.url, tmp, data, mode, args.workers)
                results[mode].append(m)
                print(f"round {r + 1}, {mode}: first outcome {m['first']:.2f} s, last {m['last']:.2f} s, workers' "
                      f"CPU {m['cpu']:.1f} s; load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        client.close()
        server.stop()
    base = {k: statistics.median(m[k] for m in results["spawn"]) for k in ("first", "last", "cpu")}
    print(f"\n| {args.workers} workers, {2 * args.clips} samples | first outcome s | vs spawn | last outcome s | "
          "vs spawn | workers' CPU s | vs spawn |\n|---|---:|---:|---:|---:|---:|---:|")
    for mode in MODES:
        if not results[mode]:
            continue
        med = {k: statistics.median(m[k] for m in results[mode]) for k in ("first", "last", "cpu")}
        print(f"| {mode} (median of {len(results[mode])}) | {med['first']:.2f} | {med['first'] / base['first']:.2f}x "
              f"| {med['last']:.2f} | {med['last'] / base['last']:.2f}x | {med['cpu']:.1f} | "
              f"{med['cpu'] / base['cpu']:.2f}x |")
    print(f"\ntook {time.perf_counter() - started:.0f} s; load average before "
          f"{' '.join(f'{x:.1f}' for x in load_before)}, after {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
