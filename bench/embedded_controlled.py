"""Benchmark: the embedded broker beside RabbitMQ with the default settings (start window, health controller,
samples per message chosen by the publisher), trivial samples, side by side in one process (issue 27, item 3).

    .venv/bin/python bench/embedded_controlled.py [--clips 100] [--repeat 1] [--amqp URL]

Each round runs ``--clips`` tiny clips x 5 through ``labswarm run --workers 2``'s machinery
(``bench/distributed.py``'s ``distributed(..., controlled=True, meter=True)``) on the embedded broker, then on
RabbitMQ. Prints per run the steady samples/s and the CPU of each part in ms per task and ms per s over the steady
20-80 % of the outcomes (manager = this process). Goal (issue 27): embedded >= 0.95x RabbitMQ's rate, its manager's
CPU per task <= 1.5x. The manager's CPU per second is about constant (routes, history, controller), so its CPU per
task follows the rate: on a loaded machine compare the pairs, not the runs.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=100, help="tiny clips (x 5 gain variants)")
    parser.add_argument("--repeat", type=int, default=1, help="embedded/RabbitMQ pairs")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-embedded-"))
    trivial = trivial_experiment(tmp, args.clips)
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


if __name__ == "__main__":
    main()
