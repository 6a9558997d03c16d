"""Benchmark: the embedded SQLite broker beside RabbitMQ, same samples, flat out, CPU split per part.

    .venv/bin/python bench/embedded_split.py [DEMO_DIR] [--clips N] [--trivial N] [--amqp URL] [--repeat K]

Runs the demo experiment's first N clips x its 9 transformations (real features, mel + MFCC) through
``labswarm run --workers 2``'s machinery with no controller and no start window (``distributed(...,
controlled=False, meter=True)`` of bench/distributed.py), once on the embedded broker and once on RabbitMQ,
alternating ``--repeat`` times, then the same with ``--trivial`` tiny clips x 5 (trivial tasks: the path's own
cost). Prints per run: steady samples/s (10th-90th percentile of finish times) and the CPU of each part over the
steady 20-80 % window (bench/distributed.py's CpuMeter: manager = this process, worker-main, pool, rabbitmq) in ms
per task and ms per s, and the load average. On a shared machine CPU ms per task is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from distributed import cpu_line, distributed, trivial_experiment  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30, help="demo clips (x 9 transformations); 0: skip")
    parser.add_argument("--trivial", type=int, default=200, help="tiny clips (x 5) of the trivial runs; 0: skip")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--repeat", type=int, default=1, help="embedded/RabbitMQ pairs per experiment")
    parser.add_argument("--embedded-only", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-emb-"))
    brokers = [("embedded", None)] + ([] if args.embedded_only else [("RabbitMQ", args.amqp)])
    experiments = []
    if args.clips:
        from features_local import demo_experiment

        make = demo_experiment(Path(args.demo), args.clips, tmp)
        experiments.append(("real", lambda slug: make(slug).model_copy(update={"name": f"bench-{slug}"}), 5000.0))
    if args.trivial:
        trivial = trivial_experiment(tmp, args.trivial)

        def make_trivial(slug: str):
            store = trivial.store.model_copy(update={"root": tmp / f"store-{slug}"})
            return trivial.model_copy(update={"name": f"trivial-{slug}", "store": store})

        experiments.append(("trivial", make_trivial, 100_000.0))
    for kind, make_config, rate in experiments:
        for _ in range(args.repeat):
            for label, broker in brokers:
                slug = uuid.uuid4().hex[:6]
                before = load()
                _, steady, progress, cpu = distributed(make_config(slug), broker, tmp / f"home-{slug}", rate=rate,
                                                       controlled=False, meter=True)
                total = sum(v[0] for k, v in cpu.items() if k != "rate")
                print(f"{kind} {progress['total']} samples, {label}: {steady:.1f} samples/s steady; CPU "
                      f"{cpu_line(cpu)}; total {total:.1f} ms/task; load {before} -> {load()}", flush=True)


if __name__ == "__main__":
    main()
