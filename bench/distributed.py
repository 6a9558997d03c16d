"""Benchmark: the distributed run vs the local pool vs a plain loop, RabbitMQ vs the embedded broker, and the
per-task overhead of manager + broker + worker.

    .venv/bin/python bench/distributed.py [DEMO_DIR] [--clips N] [--trivial N] [--amqp URL]

All runs compute the same samples (the demo experiment's first N clips x its 9 transformations, features mel +
MFCC) into fresh stores, in this one process run, side by side:

- plain loop: one process computing every sample the plain librosa way (bench/features_local.py), no store;
- `labswarm features --jobs 2`: the local process pool;
- `labswarm run --workers 2` over RabbitMQ, and over the embedded SQLite broker.

For the distributed runs two figures are printed: the wall time of the whole command (worker start-up included:
~3 s of imports per worker) and the steady rate, from the first to the last outcome recorded in the ledger.
The trivial-task run sends tiny samples (0.05-s clips, one small STFT) through the same path, at an unlimited
publish rate, to measure tasks/s and the overhead per task.
Goals (issue 3): distributed >= 0.95x the local pool and >= 1.8x the plain loop; overhead <= 2 ms per task;
embedded broker within 15% of RabbitMQ on real feature tasks.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


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


def distributed(config, broker: str | None, home: Path, workers: int = 2, rate: float = 5000.0):
    """Run ``config`` through ``labswarm run``'s machinery; returns (wall s, steady samples/s, progress)."""
    from labswarm.run import run_experiment
    from labswarm.settings import Settings

    settings = Settings(home=home, broker_url=broker, default_rate=rate)
    t0 = time.perf_counter()
    result = run_experiment(config, workers=workers, settings=settings, poll=0.2)
    wall = time.perf_counter() - t0
    p = result.progress
    if p["status"] != "completed" or p["failed"]:
        raise SystemExit(f"distributed run did not complete cleanly: {p} {result.failures[:3]}")
    rate_, _ = steady_rate(home, p["id"])
    return wall, rate_, p


def trivial_experiment(tmp: Path, n_clips: int):
    """Tiny clips x 5 gain variants, one small STFT: ~0.3 ms of compute per task."""
    from labswarm.config import parse_experiment

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30, help="clips (x 9 transformations) per timed run")
    parser.add_argument("--trivial", type=int, default=400, help="tiny clips (x 5) of the overhead run")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    args = parser.parse_args()
    from features_local import demo_experiment, plain_compute

    from labswarm.local import run_local
    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sample import iter_samples

    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-dist-"))
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
    t0 = time.perf_counter()
    summary = run_local(config_with_store("local"), jobs=2, on_result=lambda r: finished.append(time.time()))
    local = time.perf_counter() - t0
    local_steady = steady(finished)
    assert summary.computed == n, summary.failures[:3]
    print(f"local pool (2): {local:.1f} s wall, {local_steady:.2f} samples/s steady", flush=True)

    rmq_wall, rmq_rate, _ = distributed(config_with_store("rmq").model_copy(update={"name": "bench-rmq"}),
                                        args.amqp, tmp / "home-rmq")
    print(f"RabbitMQ, 2 workers: {rmq_wall:.1f} s wall, {rmq_rate:.2f} samples/s steady", flush=True)
    emb_wall, emb_rate, _ = distributed(config_with_store("emb").model_copy(update={"name": "bench-emb"}),
                                        None, tmp / "home-emb")
    print(f"embedded, 2 workers: {emb_wall:.1f} s wall, {emb_rate:.2f} samples/s steady", flush=True)

    plain_rate, local_rate = n / plain, local_steady
    print("\n| run | wall s | steady samples/s | vs plain loop | vs local pool |")
    print("|---|---:|---:|---:|---:|")
    print(f"| plain loop | {plain:.1f} | {plain_rate:.2f} | 1.00x | {plain_rate / local_rate:.2f}x |")
    print(f"| labswarm features --jobs 2 | {local:.1f} | {local_rate:.2f} | {local_rate / plain_rate:.2f}x | 1.00x |")
    for name, wall, rate in (("labswarm run --workers 2, RabbitMQ", rmq_wall, rmq_rate),
                             ("labswarm run --workers 2, embedded", emb_wall, emb_rate)):
        print(f"| {name} | {wall:.1f} | {rate:.2f} | {rate / plain_rate:.2f}x | {rate / local_rate:.2f}x |")
    print(f"\nembedded broker vs RabbitMQ (steady rate): {emb_rate / rmq_rate:.2f}x")

    trivial = trivial_experiment(tmp, args.trivial)
    tb = FeaturesBlock(trivial)
    ts = list(iter_samples(trivial))
    t0 = time.perf_counter()
    for s in ts:
        tb.compute(s)
    compute_ms = 1000 * (time.perf_counter() - t0) / len(ts)
    for label, broker, home in (("RabbitMQ", args.amqp, tmp / "home-trivial-rmq"),
                                ("embedded", None, tmp / "home-trivial-emb")):
        cfg = trivial.model_copy(update={
            "name": f"trivial-{label.lower()}",
            "store": trivial.store.model_copy(update={"root": tmp / f"store-trivial-{label}"})})
        wall, rate, _ = distributed(cfg, broker, home, rate=100_000.0)
        per_task_ms = 1000 * 2 / rate  # two single-process workers share the tasks
        print(f"trivial tasks, {label}: {rate:.0f} tasks/s steady with 2 workers: {1000 / rate:.2f} ms of wall "
              f"time per task for the whole system; per worker {per_task_ms:.2f} ms per task, of which compute "
              f"{compute_ms:.2f} ms -> overhead {per_task_ms - compute_ms:.2f} ms/task/worker", flush=True)


if __name__ == "__main__":
    main()
