"""Benchmark: a training job through the manager vs `labswarm train` on the same experiment, submit-to-first-step
latency, and the event stream's latency.

    .venv/bin/python bench/jobs.py [--epochs N] [--per-class N] [--reps N]

The experiment is a generated three-class set (tones low and high, white noise; 1-s clips), a small CNN on mel
features, features computed into the store by a warm-up run first so that every timed run only trains. Side by
side in this one process run, alternating:

- `labswarm train --no-compute EXPERIMENT` as a process of its own (Python and torch start-up included);
- the same experiment as a job: submitted to a manager served in this process, followed on its event stream to
  COMPLETED (the learner's start-up, reporting, checkpoints to the results store and the model upload included).

Printed: the wall time of each, their ratio (goal <= 1.05x), the submit-to-first-step latency (the learner's
first optimizer step is a log line stamped by the learner), and the latency of events from the learner to this
client (log lines, metrics and progress: learner's stamp -> received on the stream), p50 / p99 (goal: a metric
within 1 s).
The machine may be shared: read the figures as ratios of runs made side by side.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

SR = 16000


def write_data(root: Path, per_class: int) -> None:
    rows = ["path,label,source"]
    t = np.arange(SR) / SR
    for c, label in enumerate(("high", "low", "noise")):
        for i in range(per_class):
            rng = np.random.default_rng(100 * c + i)
            if label == "noise":
                y = 0.3 * rng.standard_normal(t.size)
            else:
                freq = (150.0 if label == "low" else 2500.0) * (1 + 0.08 * i)
                y = 0.5 * np.sin(2 * np.pi * freq * t) + 0.01 * rng.standard_normal(t.size)
            (root / label).mkdir(parents=True, exist_ok=True)
            sf.write(root / f"{label}/{label}_{i}.wav", y.astype(np.float32), SR)
            rows.append(f"{label}/{label}_{i}.wav,{label},{label}-{i}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")


def experiment(root: Path, store: Path, epochs: int) -> dict:
    return {
        "name": "bench-jobs", "seed": 0,
        "dataset": {"root": str(root), "sample_rate": SR, "segment": {"start": 0.0, "duration": 1.0}},
        "transformations": [{"name": "identity"}, {"name": "gain", "gain_db": -6.0}],
        "features": [{"name": "mel", "n_mels": 32}], "store": {"root": str(store)},
        "pipeline": [{"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 8},
                     {"name": "prefetch", "producers": 1}],
        "model": {"name": "cnn", "input": "mel", "channels": [8, 16]},
        "training": {"epochs": epochs, "learning_rate": 0.01, "validation": 0.25, "threads": 1},
    }


def train_cli(path: Path, home: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "labswarm.cli", "train", str(path), "--no-compute"], check=True,
                   env={**__import__("os").environ, "LABSWARM_HOME": str(home)}, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def run_job(client, exp: dict, results: Path) -> tuple[float, float, list[float], list[float], list[float]]:
    """(wall s, submit-to-first-step s, log latencies s, metric latencies s, progress latencies s)."""
    submitted = time.time()
    started = time.perf_counter()
    job = client.submit({"name": "bench", "experiment": exp, "results_store": {"name": "local", "path": str(results)}})
    first_step, logs, metrics, progress = float("nan"), [], [], []
    for event in client.events(job["id"]):
        received = time.time()
        data = event["data"]
        stamp = datetime.fromisoformat(data["stamp"]).timestamp()
        if event["event"] == "log":
            logs.append(received - stamp)
            if "first step" in data.get("line", "") and first_step != first_step:
                first_step = stamp - submitted
        elif event["event"] == "metric":
            metrics.append(received - stamp)
        elif event["event"] == "progress":
            progress.append(received - stamp)
        elif event["event"] == "status" and data["status"] == "failed":
            raise RuntimeError(f"the job failed: {data}")
    return time.perf_counter() - started, first_step, logs, metrics, progress


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--per-class", type=int, default=12)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()

    from labswarm.jobs.client.client import JobsClient
    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer
    from labswarm.settings import Settings

    with tempfile.TemporaryDirectory(prefix="labswarm-bench-jobs-") as tmp:
        tmp = Path(tmp)
        write_data(tmp / "data", args.per_class)
        exp = experiment(tmp / "data", tmp / "store", args.epochs)
        path = tmp / "experiment.yml"
        path.write_text(yaml.safe_dump(exp))
        print("warm-up (features into the store) ...", flush=True)
        train_cli(path, tmp / "warm")
        server = EmbeddedServer(create_app(Settings(home=tmp / "manager", data_roots=[str(tmp)]))).start()
        walls: dict[str, list[float]] = {"train": [], "job": []}
        firsts, logs, metrics, progress = [], [], [], []
        try:
            with JobsClient(server.url) as client:
                for rep in range(args.reps):
                    walls["train"].append(train_cli(path, tmp / f"train-{rep}"))
                    wall, first, log_lat, metric_lat, progress_lat = run_job(client, exp, tmp / f"results-{rep}")
                    walls["job"].append(wall)
                    firsts.append(first)
                    logs += log_lat
                    metrics += metric_lat
                    progress += progress_lat
                    print(f"rep {rep + 1}: labswarm train {walls['train'][-1]:.1f} s, job {wall:.1f} s "
                          f"(first step {first:.1f} s after submit)", flush=True)
        finally:
            server.stop()
    train, job = statistics.median(walls["train"]), statistics.median(walls["job"])
    print(f"\n{args.epochs} epochs, {3 * args.per_class} clips x 2 transformations, {args.reps} reps (medians)")
    print(f"  labswarm train (own process)     {train:7.1f} s")
    print(f"  job via the manager              {job:7.1f} s   ratio {job / train:.3f} (goal <= 1.05)")
    print(f"  submit -> first step             {statistics.median(firsts):7.2f} s")
    print(f"  event latency, log lines (n={len(logs)})   p50 {pct(logs, 50) * 1000:6.0f} ms   "
          f"p99 {pct(logs, 99) * 1000:6.0f} ms")
    print(f"  event latency, metrics (n={len(metrics)})     p50 {pct(metrics, 50) * 1000:6.0f} ms   "
          f"p99 {pct(metrics, 99) * 1000:6.0f} ms   (goal < 1000 ms)")
    print(f"  event latency, progress (n={len(progress)})    p50 {pct(progress, 50) * 1000:6.0f} ms   "
          f"p99 {pct(progress, 99) * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
