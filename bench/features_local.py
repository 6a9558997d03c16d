"""Benchmark: `labswarm features --jobs 2` vs a plain single-process loop vs joblib, on the demo set.

All three compute the same samples (the demo experiment's clips × its 9 transformations, features mel + MFCC)
in this one process run, side by side. The baselines are what a user writes with librosa: `librosa.load`, the
same transformation objects, then `librosa.feature.melspectrogram` + `power_to_db` and `librosa.feature.mfcc`
from the waveform; labswarm also hashes, checks and writes the feature store (and shares one STFT between the
two extractors). Then each transformation is timed against audiomentations' equivalent on the same clips.

    .venv/bin/python bench/features_local.py [DEMO_DIR] [--clips N]

DEMO_DIR defaults to data/demo (built with `labswarm demo-data` when missing). Prints clips/s and ratios.
Goals (issue 2): labswarm >= 1.8x the plain loop and >= 1.0x joblib; every transformation at least as fast as
audiomentations'.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def subset(demo: Path, n: int, out: Path) -> Path:
    """Write a labels CSV with the first n/3 clips of each class (absolute paths) into ``out``."""
    with open(demo / "labels.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    per_class: dict[str, list[dict]] = {}
    for row in rows:
        per_class.setdefault(row["label"], []).append(row)
    keep = [r for label in sorted(per_class) for r in per_class[label][: max(1, n // len(per_class))]]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "labels.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "label", "source"])
        writer.writeheader()
        for r in keep:
            writer.writerow({"path": str((demo / r["path"]).resolve()), "label": r["label"], "source": r["source"]})
    return out / "labels.csv"


def demo_experiment(demo: Path, clips: int, tmp: Path):
    """The demo experiment on the first ``clips`` clips of ``demo`` (built there when missing), as a factory
    ``config_with_store(name)`` of configurations that differ only by their store (``tmp/name``)."""
    if not (demo / "labels.csv").is_file():
        from labswarm.datasets.demo import build_demo_set

        print(f"building the demo set in {demo} ...", flush=True)
        build_demo_set(demo, per_class=100, seed=0, jobs=2)
    from labswarm.config.experiment import load_experiment

    base = load_experiment(ROOT / "examples" / "music_speech_noise.yml")
    dataset = base.dataset.model_copy(update={"root": demo.resolve(), "labels": subset(demo, clips, tmp / "subset")})

    def config_with_store(name: str):
        return base.model_copy(update={"dataset": dataset, "store": base.store.model_copy(update={"root": tmp / name})})

    return config_with_store


def plain_compute(sample: dict, mel: dict, mfcc: dict) -> int:
    """One sample the plain librosa way: load, transform, mel spectrogram (dB) and MFCC from the waveform."""
    import librosa

    from labswarm.audio.transforms import Transformation

    y, sr = librosa.load(sample["path"], sr=22050, offset=sample["start"], duration=sample["duration"])
    y = Transformation.from_spec(sample["transformation"])(y, sr, sample["seed"])
    m = librosa.power_to_db(librosa.feature.melspectrogram(
        y=y, sr=sr, n_fft=mel["n_fft"], hop_length=mel["hop_length"], n_mels=mel["n_mels"]), ref=1.0, top_db=80.0)
    c = librosa.feature.mfcc(y=y, sr=sr, n_mfcc=mfcc["n_mfcc"], n_fft=mfcc["n_fft"], hop_length=mfcc["hop_length"],
                             n_mels=mfcc["n_mels"])
    return m.size + c.size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30, help="clips (x 9 transformations) per timed run")
    args = parser.parse_args()
    from joblib import Parallel, delayed

    from labswarm.local import run_local
    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sample import iter_samples

    config_with_store = demo_experiment(Path(args.demo), args.clips, Path(tempfile.mkdtemp(prefix="labswarm-bench-")))
    config = config_with_store("warmup")
    samples = list(iter_samples(config))
    n_clips, n = len(samples) // len(config.transformations), len(samples)
    print(f"{n_clips} clips x {len(config.transformations)} transformations = {n} samples; features "
          f"{', '.join(f.output_name for f in config.features)}", flush=True)

    mel, mfcc = (f.model_dump() for f in config.features)
    # warm up: numba compilation and library imports in this process (forked workers inherit them)
    block = FeaturesBlock(config)
    for s in samples[: len(config.transformations)]:
        block.compute(s)
        plain_compute(s.to_dict(), mel, mfcc)

    results: dict[str, float] = {}
    t0 = time.perf_counter()
    for s in samples:
        plain_compute(s.to_dict(), mel, mfcc)
    results["plain loop"] = time.perf_counter() - t0
    print(f"plain loop     {results['plain loop']:7.1f} s", flush=True)

    t0 = time.perf_counter()
    Parallel(n_jobs=2)(delayed(plain_compute)(s.to_dict(), mel, mfcc) for s in samples)
    results["joblib (2)"] = time.perf_counter() - t0
    print(f"joblib n_jobs=2 {results['joblib (2)']:6.1f} s", flush=True)

    t0 = time.perf_counter()
    summary = run_local(config_with_store("labswarm"), jobs=2)
    results["labswarm (2)"] = time.perf_counter() - t0
    assert summary.computed == n and summary.failed == 0, summary.failures[:3]
    print(f"labswarm jobs=2 {results['labswarm (2)']:6.1f} s", flush=True)

    t0 = time.perf_counter()
    again = run_local(config_with_store("labswarm"), jobs=2)
    results["labswarm cached"] = time.perf_counter() - t0
    assert again.cached == n

    print("\n| run | samples/s | clips/s | vs plain loop | vs joblib |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds in results.items():
        print(f"| {name} | {n / seconds:.1f} | {n_clips / seconds:.2f} | {results['plain loop'] / seconds:.2f}x "
              f"| {results['joblib (2)'] / seconds:.2f}x |")

    from transforms_vs_audiomentations import compare

    from labswarm.audio.io import load_segment

    clips = [load_segment(s.path, 22050, 0.0, 10.0) for s in samples[:: len(config.transformations)][:10]]
    # a worker process owns one core: pin, as bench/transforms_vs_audiomentations.py does by default
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        rows = compare([np.asarray(c) for c in clips], 22050)
    finally:
        os.sched_setaffinity(0, cpus)
    print("\n| transformation | labswarm ms/clip | audiomentations ms/clip | time ratio (< 1: labswarm faster) |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['transformation']} | {row['labswarm_ms']:.2f} | {row['audiomentations_ms']:.2f} "
              f"| {row['ratio']:.2f} |")


if __name__ == "__main__":
    main()
