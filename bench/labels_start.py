"""Benchmark: the labels work of a session start on a large labels CSV, before and after it became one pass.

    .venv/bin/python bench/labels_start.py [--rows 200000] [--per-folder 1000] [--repeat 3] [--base COMMIT]
                                           [--data DIR]

A session start checks every row of the experiment's labels CSV against the data roots (the file may have
changed since registration) and counts the rows (the session's total = rows x transformations). Before (commit
``--base``), the start read the file three times: the registry's first check of the configuration in the
process (its paths and its rows), the start's own check of the rows, and ``count_samples``; each row's path was
built with pathlib and ``lstat``-ed. After: ``ExperimentRegistry.config_and_clips``, one pass that checks and
counts, string paths, and one listing per folder instead of one ``lstat`` per file (``PathCheck``).

In this one process, side by side (alternating, ``--repeat`` times; medians printed): the base commit's
``labswarm/paths.py`` (read from git and loaded as a module, so the old code runs, not a copy of it) doing what
the old start did, and today's registry call on a fresh registry cache (the first start after a registration or
a manager restart). The data set: ``--rows`` empty ``.wav`` files, ``--per-folder`` per folder, under a temporary
folder (or ``--data``, kept between runs: making 200k files takes ~25 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labswarm.config.experiment import parse_experiment
from labswarm.paths import DataRoots
from labswarm.sample import count_samples
from labswarm.sessions.service import SessionService
from labswarm.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
#: The commit before the one-pass start (the three reads).
BASE = "1aa732c"


def make_data(folder: Path, rows: int, per_folder: int) -> Path:
    """A labels CSV of ``rows`` empty audio files, ``per_folder`` per sub-folder, under ``folder/data``."""
    data = folder / "data"
    labels = data / "labels.csv"
    if labels.is_file() and sum(1 for _ in labels.open()) == rows + 1:
        return data
    lines = ["path,label"]
    for i in range(rows):
        sub = data / f"s{i // per_folder}"
        if i % per_folder == 0:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"c{i}.wav").touch()
        lines.append(f"s{i // per_folder}/c{i}.wav,{'ab'[i % 2]}")
    labels.write_text("\n".join(lines) + "\n")
    return data


def old_paths(base: str):
    """The module ``labswarm/paths.py`` as it was at commit ``base``."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{base}:labswarm/paths.py"], check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("old_paths", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_paths"] = module
    exec(compile(source, f"{base}:labswarm/paths.py", "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--per-folder", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--data", type=Path, help="folder kept between runs (default: a temporary one)")
    args = parser.parse_args()
    old = old_paths(args.base)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.data or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        data = make_data(folder, args.rows, args.per_folder)
        print(f"data set: {args.rows} rows in {data} ({time.perf_counter() - started:.1f} s)")
        experiment = {
            "name": "labels-bench", "dataset": {"root": str(data)},
            "transformations": [{"name": "gain", "gain_db": g} for g in (-6, -3, 0, 3, 6)],
            "features": [{"name": "stft", "n_fft": 256, "hop_length": 128}],
            "store": {"root": str(folder / "store")},
        }
        service = SessionService(Settings(home=Path(tmp) / "home", data_roots=[folder]))
        service.registry.register(experiment)
        roots = DataRoots([folder])

        def before() -> int:
            config = parse_experiment(service.registry.get("labels-bench").config)  # registry.config, then:
            old.check_experiment_paths(config, roots)  # its paths and rows, once per process
            old.check_labels_paths(config, roots)  # the start's check of the rows
            return count_samples(config)  # the start's count

        def after() -> int:
            service.registry._configs.clear()  # the first start after a registration or a manager restart
            config, clips = service.registry.config_and_clips("labels-bench")
            return clips * len(config.transformations)

        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeat):
            for name, work in (("before", before), ("after", after)):
                started = time.perf_counter()
                total = work()
                times[name].append(time.perf_counter() - started)
                assert total == args.rows * 5, (name, total)
        service.engine.dispose()
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"session start, labels work on {args.rows} rows (median of {args.repeat}, alternating):")
    print(f"  before ({args.base}, 3 reads): {b:6.2f} s   {', '.join(f'{t:.2f}' for t in times['before'])}")
    print(f"  after  (1 pass):          {a:6.2f} s   {', '.join(f'{t:.2f}' for t in times['after'])}")
    print(f"  after / before: {a / b:.3f}")


if __name__ == "__main__":
    main()
