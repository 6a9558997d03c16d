"""Benchmark: the embedded broker beside RabbitMQ with the default settings (start window, health controller,
samples per message chosen by the publisher), trivial samples, side by side in one process (issue 27, item 3).

    .venv/bin/python bench/embedded_controlled.py [--clips 100] [--repeat 1] [--amqp URL]

Each round runs ``--clips`` tiny clips x 5 through ``labswarm run --workers 2``'s machinery
(``bench/distributed.py``'s ``distributed(..., controlled=True, meter=True)``) on the embedded broker, then on
RabbitMQ. Prints per run the steady samples/s and the CPU of each part in ms per task and ms per s over the steady
20-80 % of the outcomes (manager = this process). Goal (issue 27): embedded >= 0.95x RabbitMQ's rate, its manager's
CPU per task <= 1.5x. The manager's CPU per second is about constant (routes, history, controller), so its CPU per
task follows the rate: on a loaded machine compare the pairs, not the runs. The final block gives each goal's
median over the pairs (each pair's ratio beside it), met or not; its last line says how long the benchmark took.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from distributed import GOALS, cpu_line, distributed, print_goals, trivial_experiment  # noqa: E402


def median_goal(name: str, ratios: list[float], target: float, at_most: bool = False) -> None:
    """Record a goal as the median of the pairs' ratios (each one shown beside it)."""
    value = statistics.median(ratios)
    met = value <= target if at_most else value >= target
    pairs = ", ".join(f"{r:.2f}" for r in ratios)
    GOALS.append((name, f"{value:.2f}x" + (f" (pairs: {pairs})" if len(ratios) > 1 else ""), "yes" if met else "NO"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=100, help="tiny clips (x 5 gain variants)")
    parser.add_argument("--repeat", type=int, default=1, help="embedded/RabbitMQ pairs")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-embedded-"))
    trivial = trivial_experiment(tmp, args.clips)
    rate_ratios: list[float] = []
    cpu_ratios: list[float] = []
    for _ in range(args.repeat):
        rates = {}
        for name, broker in (("embedded", None), ("RabbitMQ", args.amqp)):
            slug = uuid.uuid4().hex[:6]
            config = trivial.model_copy(update={
                "name": f"trivial-{slug}", "store": trivial.store.model_copy(update={"root": tmp / f"store-{slug}"})})
            _, rate, _, cpu = distributed(config, broker, tmp / f"home-{slug}", rate=100_000.0, controlled=True,
                                          meter=True)
            rates[name] = (rate, cpu.get("manager", (float("nan"), 0.0))[0])
            print(f"{name}: {rate:.0f} samples/s steady; {cpu_line(cpu)}; load {os.getloadavg()[0]:.1f}", flush=True)
        (er, ec), (rr, rc) = rates["embedded"], rates["RabbitMQ"]
        print(f"embedded vs RabbitMQ: rate {er / rr:.2f}x (goal >= 0.95x), manager CPU per task {ec / rc:.2f}x "
              "(goal <= 1.5x)", flush=True)
        rate_ratios.append(er / rr)
        cpu_ratios.append(ec / rc)
    samples = 5 * args.clips
    median_goal(f"issue 27: steady rate, embedded / RabbitMQ, {samples} trivial samples, default settings (>= 0.95x)",
                rate_ratios, 0.95)
    median_goal("issue 27: manager CPU per task, embedded / RabbitMQ, same runs (<= 1.5x)", cpu_ratios, 1.5,
                at_most=True)
    print_goals(started, load_before)


if __name__ == "__main__":
    main()
