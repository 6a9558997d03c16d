"""Benchmark (issue 24): a distributed learner's peak memory on a data set 1x and 10x the demo set's.

The data sets are synthesised: the experiment with its transformations and ``factor - 1`` times as many more
(``gain`` transformations of distinct small gains: new keys, same clips, same split), each training sample's mel
array written under its own key into a fresh store (random values of the demo's shape; no audio computed, no
fsync). For each (data set, budget), a fresh process does what a learner does: builds its training inputs
(``TrainingSamples``, labswarm/train/distributed/data.py: ``training.keep_bytes``'s default, or 0 to stream) and
trains ``--steps`` steps of the experiment's model with the next chunk read ahead (steps.py, one learner on a real
TCPStore cursor); its peak resident memory (``ru_maxrss``), the load time and the steps' samples/s are printed.
Then ``labswarm train`` (the single-process trainer) runs on each set for its first 60 s: the most memory its
process tree (the trainer and its prefetch producers) held at once.

    .venv/bin/python bench/store_scale.py --scale examples/music_speech_noise.yml [--factor 10] [--steps 4]

Goal (issue 24): a learner's peak memory independent of the data size (within 10 % between 1x and 10x) and under
1 GB. One learner process per data set, not the 2-learner job through the manager: each learner of that job runs
the same inputs and steps on its share of the cursor.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml


def scaled_experiment(experiment: str, factor: int, work: Path) -> Path:
    """``experiment`` with ``factor`` times its transformations (the extra ones ``gain`` of distinct gains) and
    its store in ``work/store``, written to ``work/experiment.yml``; its training split's mel arrays synthesised."""
    from labswarm.config.experiment import parse_experiment
    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.pipeline.pipeline import Pipeline
    from labswarm.storage.local import LocalStorage, LocalStorageConfig
    from labswarm.store import FeatureStore
    from labswarm.train.distributed.data import TrainingSamples

    source = Path(experiment).resolve()
    data = yaml.safe_load(source.read_text())
    data["dataset"]["root"] = str((source.parent / data["dataset"]["root"]).resolve())
    data["store"] = {"root": str(work / "store")}
    base = list(data["transformations"])
    extra = [{"name": "gain", "gain_db": -0.01 * (k + 1)} for k in range(len(base) * (factor - 1))]
    data["transformations"] = base + extra
    work.mkdir(parents=True, exist_ok=True)
    path = work / "experiment.yml"
    path.write_text(yaml.safe_dump(data))
    config = parse_experiment(data)
    block = FeaturesBlock(config)
    writer = FeatureStore(work / "store", storage=LocalStorage(LocalStorageConfig(path=work / "store", fsync=False)))
    rng = np.random.default_rng(0)
    pool = [rng.standard_normal((128, 431)).astype(np.float32) for _ in range(16)]
    samples = TrainingSamples(config, Pipeline(config, split="train"), "mel").samples
    for i, sample in enumerate(samples):
        writer.put(block.keys(sample)["mel"], pool[i % len(pool)])
    print(f"{factor}x: {len(samples)} training samples synthesised in {work}", flush=True)
    return path


def peak(experiment: str, keep: int | None, steps: int) -> dict[str, Any]:
    """In this process: a learner's training inputs on ``experiment`` (``keep_bytes`` ``keep``) and ``steps``
    32-sample training steps with the next chunk read ahead; figures as a dict."""
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore

    from labswarm.config.experiment import load_experiment
    from labswarm.pipeline.pipeline import Pipeline
    from labswarm.train.distributed.context import LearnerContext
    from labswarm.train.distributed.cursor import GlobalCursor
    from labswarm.train.distributed.data import TrainingSamples
    from labswarm.train.distributed.steps import CursorSteps
    from labswarm.train.distributed.training import DistributedTraining
    from labswarm.train.models.base import Model, feature_bins
    from labswarm.train.optim import build_optimizer

    torch.set_num_threads(1)
    config = load_experiment(experiment)
    samples = TrainingSamples(config, Pipeline(config, split="train"), "mel", keep_bytes=keep)
    started = time.perf_counter()
    n = len(samples.load())
    loaded = time.perf_counter() - started
    after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = Model.from_spec(config.model).build(feature_bins(config, config.model.input), len(samples.classes))
    optimizer = build_optimizer(torch, model.parameters(), config.training)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=1))
    learner.cursor = GlobalCursor(store, n, 32, owner="0:1:0")
    learner.samples = samples
    loop = CursorSteps(learner, torch, 0, "cpu", None)
    record = Path(tempfile.mkdtemp(prefix="learner-memory-")) / "chunks.jsonl"
    rate = 32 * steps / train_steps(loop, model, optimizer, steps, record, "0:1:0")
    return {"samples": n, "streaming": samples.streaming, "kept_mb": samples.nbytes / 1e6, "load_s": loaded,
            "rss_load_mb": after_load / 1024, "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "steps_per_s": rate}


def train_steps(loop: Any, model: Any, optimizer: Any, steps: int, record: Path, owner: str) -> float:
    """``steps`` training steps of 32 samples through a learner's :class:`CursorSteps` ``loop`` (cross-entropy,
    the chunks trained recorded in ``record`` as ``owner``), then the pass's end and the loop closed; the seconds
    they took (wall)."""
    import torch

    from labswarm.train.distributed.record import ChunkRecord

    started = time.perf_counter()
    with ChunkRecord(record, owner) as loop.trained:
        for _ in range(steps):
            batch = loop.before_step(False)
            assert batch is not None
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
            optimizer.step()
            loop.after_step()
        loop.before_step(True)
    loop.close()
    return time.perf_counter() - started


def train_peak(experiment: Path, seconds: float, home: Path) -> dict[str, float]:
    """``labswarm train --no-compute --retrain experiment`` for ``seconds`` (then stopped: an epoch of the 10x
    set lasts far longer): the most memory its process tree held at once (the sum of its processes' proportional
    set sizes, psutil, every 0.25 s) and the trainer process's own peak (``VmHWM``), MB."""
    import signal

    import psutil

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LABSWARM_HOME": str(home)}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "labswarm"), "train", "--no-compute", "--retrain",
                             str(experiment)], env=env, stdout=subprocess.DEVNULL,
                            stderr=(home / "train.log").open("wb"), start_new_session=True)
    top, hwm, seen = 0, 0, {proc.pid}
    deadline = time.monotonic() + seconds
    try:
        root = psutil.Process(proc.pid)
        while time.monotonic() < deadline and proc.poll() is None:
            total = 0
            tree = [root, *root.children(recursive=True)]
            seen.update(process.pid for process in tree)
            for process in tree:
                try:
                    total += process.memory_full_info().pss  # shared-memory batches counted once
                except psutil.Error:
                    continue
            top = max(top, total)
            with contextlib.suppress(OSError, IndexError, ValueError):
                hwm = max(hwm, int(Path(f"/proc/{proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]))
            time.sleep(0.25)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the trainer and its producers: its own process group
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in seen:  # the shared-memory batches of a killed trainer (its next start would remove them)
            for segment in Path("/dev/shm").glob(f"labswarm_*_{pid}_*"):
                segment.unlink(missing_ok=True)
    return {"tree_mb": top / 1e6, "trainer_hwm_mb": hwm * 1024 / 1e6, "exit": float(proc.returncode)}


def scale(experiment: str, factor: int, steps: int, train_s: float = 60.0) -> None:
    """Synthesise the 1x and ``factor``x data sets and measure a learner process's peak memory on each."""
    work = Path(tempfile.mkdtemp(prefix="learner-memory-"))
    try:
        sets = {f"{f}x": scaled_experiment(experiment, f, work / f"{f}x") for f in (1, factor)}
        runs = [(f"1x, {'default budget'}", sets["1x"], None), ("1x, streamed", sets["1x"], 0),
                (f"{factor}x, default budget", sets[f"{factor}x"], None)]
        print(f"load {os.getloadavg()[0]:.1f}", flush=True)
        for name, path, keep in runs:
            done = subprocess.run([sys.executable, __file__, "--peak", str(path), "--keep", str(keep),
                                   "--steps", str(steps)], capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")]
            if done.returncode or not lines:
                print(f"{name}: failed ({done.returncode})\n{done.stderr[-2000:]}", flush=True)
                continue
            out = json.loads(lines[0].removeprefix("PEAK "))
            print(f"{name:24s} {out['samples']:6d} samples  streaming {out['streaming']!s:5s}  kept "
                  f"{out['kept_mb']:6.0f} MB  load {out['load_s']:5.1f} s  peak RSS after load "
                  f"{out['rss_load_mb']:6.0f} MB, after {steps} steps {out['rss_peak_mb']:6.0f} MB  "
                  f"{out['steps_per_s']:5.1f} samples/s  (load {os.getloadavg()[0]:.1f})", flush=True)
        for name, path in sets.items():
            out = train_peak(path, train_s, path.parent / "home")
            print(f"labswarm train, {name:4s} first {train_s:.0f} s: process tree (PSS) at most "
                  f"{out['tree_mb']:6.0f} MB "
                  f"at once, trainer's peak RSS {out['trainer_hwm_mb']:6.0f} MB, exit {out['exit']:.0f} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
            print("  its log's last lines: " + " | ".join(
                (path.parent / "home" / "train.log").read_text(errors="replace").strip().splitlines()[-3:]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--peak", required=True)
    parser.add_argument("--keep", default="None")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    figures = peak(args.peak, None if args.keep == "None" else int(args.keep), args.steps)
    print("PEAK " + json.dumps(figures), flush=True)
