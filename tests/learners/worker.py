"""A learner program for the tests: trains the tiny model under a framework, as one rank of a job.

``python tests/learners/worker.py SPEC_JSON`` with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (and
LABSWARM_PS_ADDRS) in the environment. SPEC: ``framework`` (a spec), ``steps``, ``batch`` (per learner),
``optimizer`` (``sgd`` or ``adamw``), ``lr``, ``snapshots`` (steps after which to keep the parameters),
``out`` (folder: ``rank-<r>.pt`` gets the final parameters, the framework's stats and, with ``eval``, the
accuracy on a held-out batch), ``pause`` (``{step, dir}``: after that step, touch ``dir/paused-<rank>``
and wait for ``dir/go``), ``hang`` (``[rank, step]``: that rank sleeps before that step).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tiny import tiny_batch, tiny_model

from labswarm.learners import Framework, LearnerContext


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    ctx = LearnerContext.from_env()
    framework = Framework.from_spec(spec["framework"])
    if not framework.needs_parameter_server:
        ctx.init_process_group("gloo")
    model = tiny_model(torch, seed=spec.get("init_seed", 0))
    opt_cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[spec.get("optimizer", "sgd")]
    optimizer = opt_cls(model.parameters(), lr=spec.get("lr", 0.1))
    module = framework.attach(model, optimizer, ctx)
    b, n = spec["batch"], ctx.world_size
    snapshots = {}
    for step in range(spec["steps"]):
        if spec.get("hang") == [ctx.rank, step + 1]:  # this rank never joins step `step + 1`'s collective
            time.sleep(600)
        x, y = tiny_batch(torch, step, b * n, seed=spec.get("data_seed", 0))
        x, y = x[ctx.rank * b:(ctx.rank + 1) * b], y[ctx.rank * b:(ctx.rank + 1) * b]
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
        if spec.get("pause") and step + 1 == spec["pause"]["step"]:  # the test acts while every learner waits
            pause = Path(spec["pause"]["dir"])
            (pause / f"paused-{ctx.rank}").touch()
            deadline = time.monotonic() + 60
            while not (pause / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        if step + 1 in spec.get("snapshots", ()):
            snapshots[step + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result = {"snapshots": snapshots, "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
              "stats": framework.stats.as_dict(), "state": framework.state_dict()}
    if spec.get("eval"):
        framework.finish()
        x, y = tiny_batch(torch, 10**6, 2000, seed=99)
        with torch.no_grad():
            result["accuracy"] = float((model(x).argmax(1) == y).float().mean())
        result["params"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(result, Path(spec["out"]) / f"rank-{ctx.rank}.pt")
    framework.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
