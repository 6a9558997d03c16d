"""Benchmark: how long the trainer waits for data with labswarm's prefetch vs torch's DataLoader vs no prefetch.

The data work is CPU-heavy on purpose: every variant reads the demo experiment's samples (clips × 9
transformations) through the pipeline's features block into a fresh, empty feature store, so every batch is
computed on the fly (load, transform, mel spectrogram) and stored. The trainer's step has a fixed cost that
uses no CPU (``time.sleep``), so the producers have both cores; by default it is one core's time to build a
batch (measured first), so 2 producers on 2 cores keep up with 2x headroom (the machine may be shared: the
load average is printed with every run). Side by side, in this one
process:

- labswarm ``Prefetcher``, 2 producers (``prefetch: {producers: 2, depth: 4}``);
- torch ``DataLoader(num_workers=2, prefetch_factor=4)`` over ``PipelineIterableDataset`` (the same chain in
  each worker, batches as tensors) and over ``StoreDataset`` (map-style, the DataLoader batches and collates);
- no prefetch: the chain in the trainer's process (``producers: 0``).

Then the hand-off alone: ready-made batches of the same size (no compute, no step), to price what moving one
batch from a producer to the trainer costs in wall time and in the trainer's CPU.

    .venv/bin/python bench/prefetch.py [DEMO_DIR] [--clips N] [--batch B] [--step SECONDS] [--handoff [N]]

DEMO_DIR defaults to data/demo (built when missing). --clips 60 takes ~2-3 minutes on 2 cores. ``--handoff``
runs the hand-off test alone (N batches, default 100; ~10 s).
Goal (issue 5): waiting < 5% where the producers can keep up, and no worse than DataLoader.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from features_local import demo_experiment  # noqa: E402

FRAMES = 431  #: frames of a 10-s clip at hop 512, 22.05 kHz
DEPTH = 4  #: batches each producer / worker may hold ready


@dataclass
class Run:
    """What the trainer saw over one epoch.

    Attributes:
        name: the variant.
        samples: samples trained on.
        batches: batches trained on.
        seconds: wall time from asking for the first batch (producers start then) to the end of the epoch.
        waits: seconds spent in ``next()`` per batch (the last entry: waiting for the end of the epoch).
        cpu: CPU seconds of the trainer's process (all its threads) over the epoch.
        cpu_first: CPU seconds of the trainer's process up to the first batch (start-up, pipeline fill).
    """

    name: str
    samples: int
    batches: int
    seconds: float
    waits: list[float]
    cpu: float
    cpu_first: float

    @property
    def wait_share(self) -> float:
        return sum(self.waits) / self.seconds

    @property
    def steady_share(self) -> float:
        """Share of waiting after the first batch (the first one waits for the pipeline to fill)."""
        return sum(self.waits[1:]) / (self.seconds - self.waits[0])


def train(name: str, start: Callable[[], Iterable[Any]], step: float) -> Run:
    """Iterate what ``start()`` returns as a trainer would, sleeping ``step`` s per batch; time the waits."""
    waits: list[float] = []
    samples = batches = 0
    cpu_first = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    it: Iterator[Any] = iter(start())
    try:
        while True:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                waits.append(time.perf_counter() - w0)
                break
            waits.append(time.perf_counter() - w0)
            if not batches:
                cpu_first = time.process_time() - c0
            samples += len(batch[1]) if isinstance(batch, list | tuple) else len(batch.ids)
            batches += 1
            time.sleep(step)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    run = Run(name, samples, batches, time.perf_counter() - t0, waits, time.process_time() - c0, cpu_first)
    print(f"  {name}: {run.samples} samples in {run.seconds:.1f} s, waiting {100 * run.wait_share:.1f}% "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    return run


def blocks(size: int, producers: int) -> list[dict[str, Any]]:
    """The chain: every sample of the subset, shuffled, mel computed into the (empty) store, batched."""
    return [
        {"name": "source"},
        {"name": "shuffle", "buffer": 1000},
        {"name": "features", "outputs": ["mel"]},
        {"name": "batch", "size": size, "frames": FRAMES},
        {"name": "prefetch", "producers": producers, "depth": DEPTH},
    ]


def compute_variants(config_with_store: Callable[[str], Any], size: int, step: float) -> list[Run]:
    """The four variants, each over a fresh store (so each computes every batch)."""
    import torch
    from torch.utils.data import DataLoader

    from labswarm.pipeline import Pipeline
    from labswarm.pipeline.torch_data import PipelineIterableDataset, StoreDataset

    def labswarm(producers: int) -> Callable[[], Iterable[Any]]:
        def start() -> Iterable[Any]:
            store = "labswarm" if producers else "none"
            return Pipeline(config_with_store(store), split="all", blocks=blocks(size, producers)).epoch(0)
        return start

    def torch_iterable() -> Iterable[Any]:
        pipeline = Pipeline(config_with_store("torch-iterable"), split="all", blocks=blocks(size, 0))
        return DataLoader(PipelineIterableDataset(pipeline), batch_size=None, num_workers=2, prefetch_factor=DEPTH)

    def torch_map() -> Iterable[Any]:
        ds = StoreDataset(config_with_store("torch-map"), split="all", output="mel", frames=FRAMES)
        return DataLoader(ds, batch_size=size, shuffle=True, num_workers=2, prefetch_factor=DEPTH,
                          generator=torch.Generator().manual_seed(0))

    return [
        train("labswarm Prefetcher, 2 producers", labswarm(2), step),
        train("DataLoader(2), PipelineIterableDataset", torch_iterable, step),
        train("DataLoader(2), StoreDataset (map)", torch_map, step),
        train("no prefetch (chain in the trainer)", labswarm(0), step),
    ]


def handoff_variants(experiment: Any, size: int, n: int) -> list[Run]:
    """Ready-made batches of ``size`` mel arrays, ``n`` per producer, pulled as fast as they come."""
    from torch.utils.data import DataLoader

    from labswarm.pipeline import Block, Pipeline
    from labswarm.pipeline.blocks.batch import Batch
    from labswarm.pipeline.torch_data import PipelineIterableDataset

    class Ready(Block):
        """Yields ``n`` fresh copies of one batch (a copy, as a batch block's ``np.stack`` makes one)."""

        name = "ready"

        def __call__(self, items: Any, ctx: Any) -> Iterator[Batch]:
            template = np.random.default_rng(0).standard_normal((size, 128, FRAMES)).astype(np.float32)
            for i in range(n):
                yield Batch({"mel": template.copy()}, np.zeros(size, np.int64), [f"{ctx.producer}-{i}"] * size)

    def pipeline(producers: int) -> Pipeline:
        return Pipeline(experiment, split="all", blocks=[Ready(), {"name": "prefetch", "producers": producers,
                                                                   "depth": DEPTH}])

    def loader(tensors: bool) -> Callable[[], Iterable[Any]]:
        return lambda: DataLoader(PipelineIterableDataset(pipeline(0), tensors=tensors), batch_size=None,
                                  num_workers=2, prefetch_factor=DEPTH)

    return [
        train("labswarm Prefetcher, 2 producers", lambda: pipeline(2).epoch(0), 0.0),
        train("DataLoader(2), tensors (shared memory)", loader(True), 0.0),
        train("DataLoader(2), numpy batches (pickled)", loader(False), 0.0),
    ]


def table(runs: list[Run], baseline: Run, none: Run) -> None:
    """The compute runs side by side; speed ratios against ``baseline`` (DataLoader) and ``none``."""
    print("| variant | samples/s | waiting | waiting after the 1st batch | median wait per batch ms "
          "| trainer CPU ms/batch after the 1st | vs DataLoader (iterable) | vs no prefetch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        rate = r.samples / r.seconds
        print(f"| {r.name} | {rate:.1f} | {100 * r.wait_share:.1f}% | {100 * r.steady_share:.1f}% "
              f"| {1000 * statistics.median(r.waits[1:-1] or r.waits):.1f} "
              f"| {1000 * (r.cpu - r.cpu_first) / max(1, r.batches - 1):.1f} "
              f"| {rate / (baseline.samples / baseline.seconds):.2f}x | {rate / (none.samples / none.seconds):.2f}x |")


def handoff_table(runs: list[Run], mib: float) -> None:
    """The hand-off runs after their first batch (start-up excluded): wall time and trainer CPU per batch,
    throughput; time ratios against the first run."""

    def per(r: Run) -> tuple[float, float]:
        n = max(1, r.batches - 1)
        return (r.seconds - r.waits[0]) / n, (r.cpu - r.cpu_first) / n

    print(f"| hand-off | ms/batch (wall) | MiB/s | trainer CPU ms/batch | time vs {runs[0].name} |")
    print("|---|---:|---:|---:|---:|")
    for r in runs:
        wall, cpu = per(r)
        print(f"| {r.name} | {1000 * wall:.1f} | {mib / wall:.0f} | {1000 * cpu:.1f} | {wall / per(runs[0])[0]:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=60, help="clips (x 9 transformations) per variant")
    parser.add_argument("--batch", type=int, default=32, help="samples per batch (32 x 128 x 431 float32 = 7 MB)")
    parser.add_argument("--step", type=float, default=None,
                        help="trainer step in seconds (default: one core's time to build a batch)")
    parser.add_argument("--handoff", type=int, nargs="?", const=100, default=None, metavar="N",
                        help="only the hand-off test, with N ready-made batches (default 100; 100 after the "
                             "compute test without this flag)")
    args = parser.parse_args()
    handoff = args.handoff or 100

    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sample import iter_samples
    from labswarm.threads import limit_threads

    limit_threads(1)  # every process computes with one maths thread (producers and workers do too)
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-prefetch-"))
    try:
        config_with_store = demo_experiment(Path(args.demo), args.clips, tmp)
        config = config_with_store("warmup")
        samples = list(iter_samples(config))
        mib = args.batch * 128 * FRAMES * 4 / 2**20
        if args.handoff is not None:
            print(f"hand-off only: {handoff} ready-made batches of {args.batch} mel arrays ({mib:.1f} MiB each), "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
            moves = handoff_variants(config, args.batch, handoff // 2)
            print(f"\nhand-off of {mib:.1f} MiB batches ({handoff} per run), no compute, no step:\n")
            handoff_table(moves, mib)
            return
        print(f"{len(samples)} samples ({len(samples) // len(config.transformations)} clips x "
              f"{len(config.transformations)} transformations), batches of {args.batch} mel arrays "
              f"({args.batch * 128 * FRAMES * 4 / 2**20:.1f} MiB each)", flush=True)

        # warm up here (numba, FFT plans): producers and workers fork from this process and inherit it
        block = FeaturesBlock(config)
        block.warm_up()
        # 18 samples over the clips, each transformation twice (costs differ 10x between transformations)
        t, n_clips = len(config.transformations), len(samples) // len(config.transformations)
        calibration = [samples[c * t + i % t] for i, c in enumerate(np.linspace(0, n_clips - 1, 2 * t).astype(int))]
        passes = []
        for _ in range(2):  # the faster of two passes: the machine may be shared
            t0 = time.perf_counter()
            for s in calibration:
                block.compute(s, {"mel"})
            passes.append(time.perf_counter() - t0)
        per_sample = min(passes) / len(calibration)
        batch_cost = per_sample * args.batch
        step = args.step if args.step is not None else batch_cost
        print(f"one core builds a batch in ~{batch_cost:.2f} s ({1000 * per_sample:.0f} ms/sample): 2 producers "
              f"~{batch_cost / 2:.2f} s per batch; trainer step {step:.2f} s (sleep)", flush=True)

        print("\ncompute on the fly, fixed trainer step:", flush=True)
        runs = compute_variants(config_with_store, args.batch, step)
        print("\nhand-off only (ready-made batches, no step):", flush=True)
        moves = handoff_variants(config, args.batch, handoff // 2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nfeatures computed on the fly, trainer step {step:.2f} s, {args.clips} clips:\n")
    table(runs, runs[1], runs[-1])
    print(f"\nhand-off of {mib:.1f} MiB batches ({handoff} per run), no compute, no step:\n")
    handoff_table(moves, mib)


if __name__ == "__main__":
    main()
