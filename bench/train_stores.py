"""Benchmark (issue 24, the store half as whole runs): ``labswarm train`` on the experiment with its store local,
on s3 through a warm cache and on s3 through a cold one; samples/s from the trainer's own metrics.

``bench/learner_stores.py`` (``store_scale.py --learner-s3``) times a learner's steps in one process; this runs the
real command. The experiment's computed store is copied into the s3 bucket first (``learner_stores.copy_to_s3``:
the same keys, the s3 default layout, written packs of a worker's message). Then, in interleaved rounds, one
``labswarm train --no-compute --retrain`` process per form (its own ``LABSWARM_HOME``), on the experiment with
``training.epochs`` set to ``epochs`` and ``training.keep_bytes`` to ``keep_bytes`` (0: the split streamed, as a
data set over the learner's budget is; unset: the default budget, 1 GiB, which keeps the demo set's 469 MB in
memory, so the store is read once at the trainer's start):

- **local**: the store in its folder (``store.root``, the demo set's ``data/store``);
- **s3 warm**: the store on s3 (``store.remote``), its cache (``store.root``) filled once before the rounds by
  ``labswarm store pull`` (the documents' "copied locally", timed), the whole set fitting the default 10 GiB bound;
- **s3 cold**: the store on s3 through a fresh, empty cache folder each round: the first run on a machine. Its
  first epoch reads s3 (each written pack fetched once), its later epochs the cache.

Per form and round: each epoch's ``samples_per_s`` (training samples per second of its steps; validation and the
start excluded: the trainer's metrics, ``<home>/train/<run>/metrics.jsonl``, :meth:`labswarm.train.trainer.Trainer.fit`)
and ``data_wait_s``, and the
process's whole wall time (start, load, every epoch's steps and validation, the model saved).

    .venv/bin/python bench/store_scale.py --train-s3 examples/music_speech_noise.yml [--epochs 2] [--rounds R]
                                          [--keep-bytes 0]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

FORMS = ("local", "s3 warm cache", "s3 cold cache")


def experiment_file(experiment: str, work: Path, name: str, store: dict, epochs: int,
                    keep_bytes: int | None) -> Path:
    """``experiment`` with absolute dataset paths, the store ``store``, ``epochs`` epochs and ``keep_bytes`` (when
    not ``None``), written to ``work/<name>.yml``."""
    from labswarm.config.experiment import load_experiment

    config = load_experiment(experiment)
    data = yaml.safe_load(Path(experiment).read_text())
    data["dataset"] = {**data["dataset"], "root": str(config.dataset.root), "labels": str(config.dataset.labels_path)}
    data["store"] = store
    data["training"] = {**data.get("training", {}), "epochs": epochs,
                        **({} if keep_bytes is None else {"keep_bytes": keep_bytes})}
    path = work / f"{name.replace(' ', '-')}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def labswarm(*args: str, home: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """``labswarm ARGS`` with ``LABSWARM_HOME`` ``home``: the finished process, its wall seconds and the CPU seconds
    of it and its children (user + system)."""
    home.mkdir(parents=True, exist_ok=True)
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "labswarm"), *args], capture_output=True, text=True,
                          env={**os.environ, "LABSWARM_HOME": str(home)}, check=False)
    seconds, after = time.perf_counter() - started, os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if done.returncode:
        raise RuntimeError(f"labswarm {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
    return done, seconds, cpu


def train_stores(experiment: str, spec: dict, epochs: int, rounds: int, keep_bytes: int | None, per_message: int,
                 server_cpu: Callable[[], float | None]) -> None:
    """The benchmark of the module docstring on ``experiment`` (its store computed), the s3 bucket of ``spec``."""
    from learner_stores import copy_to_s3  # bench/ is the script's folder, first on sys.path

    from labswarm.config.experiment import load_experiment

    config = load_experiment(experiment)
    work = Path(tempfile.mkdtemp(prefix="train-s3-"))
    try:
        arrays, packs, seconds = copy_to_s3(config, spec, per_message)
        print(f"copied {arrays} arrays into s3 as {packs} written packs in {seconds:.1f} s", flush=True)
        stores = {"local": {"root": str(config.store.root)},
                  "s3 warm cache": {"root": str(work / "warm"), "remote": spec}}
        files = {name: experiment_file(experiment, work, name, store, epochs, keep_bytes)
                 for name, store in stores.items()}
        _, seconds, _ = labswarm("store", "pull", str(files["s3 warm cache"]), home=work / "home-pull")
        print(f"s3 warm: cache filled by labswarm store pull in {seconds:.1f} s", flush=True)
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in FORMS}
        for r in range(rounds):
            for name in (FORMS if r % 2 == 0 else FORMS[::-1]):
                path = files.get(name) or experiment_file(
                    experiment, work, f"cold-{r}", {"root": str(work / f"cold-{r}"), "remote": spec}, epochs,
                    keep_bytes)
                server, home = server_cpu(), work / f"home-{r}-{name.replace(' ', '-')}"
                _, seconds, cpu = labswarm("train", "--no-compute", "--retrain", str(path), home=home)
                after = server_cpu()
                records = [json.loads(line) for metrics in sorted(home.glob("train/*/metrics.jsonl"))
                           for line in metrics.read_text().splitlines() if '"samples_per_s"' in line]
                assert len(records) == epochs, f"{name}: {len(records)} epochs' metrics in {home}, not {epochs}"
                results[name].append({"epochs": records, "wall_s": seconds, "cpu_s": cpu,
                                      "server_s": None if server is None or after is None else after - server})
                shutil.rmtree(work / f"cold-{r}", ignore_errors=True)
                shutil.rmtree(home, ignore_errors=True)
                print(f"round {r + 1}: {name}: " + ", ".join(
                    f"epoch {e['epoch']} {e['samples_per_s']:.1f} samples/s (data wait {e['data_wait_s']:.1f} s)"
                    for e in records) + f"; the run {seconds:.1f} s, CPU {cpu:.1f} s, load {os.getloadavg()[0]:.1f}",
                    flush=True)
        report(results, epochs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, list[dict[str, Any]]], epochs: int) -> None:
    """Medians per form and epoch: samples/s and the ratio to the local store's; the whole run's wall time."""
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    print(f"\nmedians of {len(results['local'])} rounds ({epochs} epochs a run):")
    base = [median([run["epochs"][e]["samples_per_s"] for run in results["local"] if len(run["epochs"]) > e])
            for e in range(epochs)]
    wall = median([run["wall_s"] for run in results["local"]])
    for name in FORMS:
        runs = results[name]
        parts = []
        for e in range(epochs):
            rate = median([run["epochs"][e]["samples_per_s"] for run in runs if len(run["epochs"]) > e])
            wait = median([run["epochs"][e]["data_wait_s"] for run in runs if len(run["epochs"]) > e])
            parts.append(f"epoch {e + 1} {rate:6.1f} samples/s {rate / base[e]:5.2f}x (data wait {wait:4.1f} s)")
        run_wall = median([run["wall_s"] for run in runs])
        servers = [run["server_s"] for run in runs if run["server_s"] is not None]
        server = f", the S3 server's CPU {median(servers):.1f} s" if servers else ""
        print(f"  {name:14s} " + "; ".join(parts) + f"; the run {run_wall:.1f} s ({wall / run_wall:.2f}x the local "
              f"store's speed), CPU {median([run['cpu_s'] for run in runs]):.1f} s{server}")
