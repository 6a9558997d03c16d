"""Benchmark: the feature store's writes with an fsync per array against one sync per batch (issue 27).

    .venv/bin/python bench/store_sync.py [FOLDER] [--arrays 16] [--rounds 8]

Writes ``--arrays`` small arrays (129 x 9 float32, a trivial sample's STFT: 4.6 KB) into a fresh store in FOLDER
(default: the system's temporary folder; put it on the disk the store will live on), alternating rounds of
``FeatureStore.put`` alone (each array fsynced before its rename) and of the same puts inside
``FeatureStore.batch()`` (one ``syncfs`` at the end, then the renames). Prints the median and the minimum ms per
array of each, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from labswarm.store.store import FeatureStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", default=tempfile.gettempdir())
    parser.add_argument("--arrays", type=int, default=16, help="arrays per batch (a message's samples)")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder, prefix="labswarm-bench-sync-") as tmp:
        store = FeatureStore(Path(tmp) / "store")
        array = np.random.default_rng(0).standard_normal((129, 9)).astype(np.float32)
        keys = (f"{i:040x}" for i in range(1, 10**9))
        ms: dict[str, list[float]] = {"fsync per array": [], "one sync per batch": []}
        for _ in range(args.rounds):
            for mode, times in ms.items():
                t0 = time.perf_counter()
                if mode == "one sync per batch":
                    with store.batch():
                        for _ in range(args.arrays):
                            store.put(next(keys), array)
                else:
                    for _ in range(args.arrays):
                        store.put(next(keys), array)
                times.append(1000 * (time.perf_counter() - t0) / args.arrays)
    for mode, times in ms.items():
        print(f"{mode}: median {statistics.median(times):.2f} ms per array, min {min(times):.2f} "
              f"({args.arrays} arrays a batch, {args.rounds} rounds)")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
