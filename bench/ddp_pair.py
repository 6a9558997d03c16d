"""Benchmark (issue 13): what the machine allows two learners, without labswarm: the demo model's training step
alone, twice side by side, and twice under DDP (gloo), in rounds that alternate the three.

    .venv/bin/python bench/ddp_pair.py [--seconds 10] [--rounds 5] [--pin] [--modes single,pair,ddp,ddp1,flat]

Each run is fresh processes (spawned) training :class:`~labswarm.train.models.nets.MelCNN` (channels 16, 32, 64,
64; the demo experiment's model) with AdamW on one fixed random batch of 32 × 128 mel bands × 128 frames (the demo
pipeline's 3-s crops), one torch thread per process, for ``--seconds`` after 3 warm-up steps. ``single``: one
process; ``pair``: two independent processes (the machine's ceiling for two learners); ``ddp``: two processes
in one gloo group, the model in ``DistributedDataParallel`` (a gradient all-reduce inside every backward and a
buffer broadcast before every forward; the ranks also agree when to end, one small all-reduce per step).
``ddp1``: DDP with one gradient bucket (all-reduced once the backward is done: no overlap, which two
processes on two cores have no spare core for), no buffer broadcast, gradients as bucket views; ``flat``: no DDP,
the gradients flattened into one tensor and all-reduced after the backward. ``--pin`` puts rank ``r`` on core
``r``; ``--modes`` picks the modes (``single`` and ``pair`` always).

Printed per round: samples/s of each run (both processes together), then the median over rounds of pair/single,
ddp/single (the allreduce scaling goal of issue 13 is >= 1.6) and ddp/pair (what DDP's synchronisation costs).
Rounds alternate so that the machine's drift falls on all three alike; on a shared 2-core host the speed swings
~15 % between runs, so read the medians.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from datetime import timedelta

MODES = ("single", "pair", "ddp", "ddp1", "flat")
#: The modes whose two processes train in one gloo group.
GROUPED = ("ddp", "ddp1", "flat")
BATCH, BANDS, FRAMES = 32, 128, 128


def _learner(rank: int, world: int, mode: str, seconds: float, port: int, pin: bool, out: mp.Queue) -> None:
    if pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    import torch
    import torch.distributed as dist

    from labswarm.train.models.nets import MelCNN

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MelCNN(3, [16, 32, 64, 64], 0.0)
    module = model
    if mode in GROUPED:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), use_libuv=True)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    if mode == "ddp":
        module = torch.nn.parallel.DistributedDataParallel(model)
    elif mode == "ddp1":  # one bucket (all-reduced once the backward is done), no buffer broadcast
        module = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1024, broadcast_buffers=False,
                                                           gradient_as_bucket_view=True)
    x, y = torch.randn(BATCH, BANDS, FRAMES), torch.randint(0, 3, (BATCH,))
    optimizer = torch.optim.AdamW(model.parameters(), 1e-3)
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        optimizer.zero_grad(set_to_none=mode != "flat")
        torch.nn.functional.cross_entropy(module(x), y).backward()
        if mode == "flat":  # one all-reduce of the flattened gradients after the backward, no DDP
            grads = [p.grad for p in params]
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat /= world
            for g, s in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
                g.copy_(s)
        optimizer.step()

    for _ in range(3):
        step()
    steps, t0 = 0, time.perf_counter()
    while True:
        step()
        steps += 1
        done = time.perf_counter() - t0 >= seconds
        if mode in GROUPED:  # both ranks stop at the same step (DDP needs equal step counts)
            flag = torch.tensor([int(done)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            done = bool(flag.item())
        if done:
            break
    out.put(BATCH * steps / (time.perf_counter() - t0))
    if mode in GROUPED:
        dist.destroy_process_group()


def run(mode: str, seconds: float, pin: bool) -> float:
    """Samples/s of one run of ``mode``, all its processes together."""
    import torch.distributed as dist

    world = 1 if mode == "single" else 2
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True) \
        if mode in GROUPED else None
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_learner, args=(r, world, mode, seconds, store.port if store else 0, pin, out))
             for r in range(world)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per run (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of single, pair, ddp (default 5)")
    parser.add_argument("--pin", action="store_true", help="rank r on core r")
    parser.add_argument("--modes", default=",".join(MODES), help=f"modes to alternate (default {','.join(MODES)})")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES) or {"single", "pair"} - set(modes):
        parser.error(f"--modes: unknown or missing {sorted(unknown)} (single and pair are the baselines)")
    results: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.rounds):
        for mode in modes:
            results[mode].append(run(mode, args.seconds, args.pin))
        print(f"round {i + 1}: " + "  ".join(f"{m} {results[m][-1]:6.1f}" for m in modes) + "  samples/s")
    pairs = [("pair/single", "pair", "single")] + [(f"{m}/{d}", m, d) for m in modes if m in GROUPED
                                                   for d in ("single", "pair")]
    ratios = {name: statistics.median(a / b for a, b in zip(results[num], results[den], strict=True))
              for name, num, den in pairs}
    print("medians over rounds: " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
          + "   (issue 13's goal for allreduce: <grouped>/single >= 1.6x)")
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
