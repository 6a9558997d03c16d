"""A learner program for the tests: trains the tiny model under a framework, as one rank of a job.

``python tests/learners/worker.py SPEC_JSON`` with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (and
LABSWARM_PS_ADDRS) in the environment. SPEC: ``framework`` (a spec), ``steps``, ``batch`` (per learner),
``optimizer`` (``sgd`` or ``adamw``), ``lr``, ``snapshots`` (steps after which to keep the parameters),
``out`` (folder: ``rank-<r>.pt`` gets the final parameters, the framework's stats and, with ``eval``, the
accuracy on a held-out batch), ``pause`` (``{step, dir}``: after that step, touch ``dir/paused-<rank>``
and wait for ``dir/go``), ``hang`` (``[rank, step]``: that rank sleeps before that step), ``cursor``
(``{n_samples, chunk_size, lease_s, passes}``: one step per chunk of the global cursor, see
:func:`train_on_cursor`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from tiny import tiny_batch, tiny_model

from labswarm.train.distributed import Framework, LearnerContext
from labswarm.train.distributed.cursor import GlobalCursor


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    ctx = LearnerContext.from_env()
    framework = Framework.from_spec(spec["framework"])
    if not framework.needs_parameter_server and framework.group_size == 1:  # worker groups join their own
        ctx.init_process_group("gloo")
    model = tiny_model(torch, seed=spec.get("init_seed", 0))
    opt_cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[spec.get("optimizer", "sgd")]
    optimizer = opt_cls(model.parameters(), lr=spec.get("lr", 0.1))
    module = framework.attach(model, optimizer, ctx)
    snapshots = (train_on_cursor(spec, ctx, module, optimizer) if "cursor" in spec
                 else train_steps(spec, ctx, model, module, optimizer))
    result = {"snapshots": snapshots, "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
              "stats": framework.stats.as_dict(), "state": framework.state_dict(),
              "divergence": [list(framework.stats.divergence), list(getattr(framework, "divergence_after", []))]}
    if spec.get("eval"):
        framework.finish()
        x, y = tiny_batch(torch, 10**6, 2000, seed=99)
        with torch.no_grad():
            result["accuracy"] = float((model(x).argmax(1) == y).float().mean())
        result["params"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(result, Path(spec["out"]) / f"rank-{ctx.rank}.pt")
    framework.close()
    # the result is written: end here, without gloo's and the interpreter's teardown, which the tests do not check
    # and which once aborted a learner under load in CI ("terminate called without an active exception", exit -6,
    # 2026-11-26: a C++ thread of the process group still joinable at destruction)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_on_cursor(spec: dict, ctx: LearnerContext, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """One step per chunk claimed from the global cursor, for ``cursor.passes`` passes over a fixed set of
    ``cursor.n_samples`` examples; each chunk marked done is recorded in ``rank-<r>.jsonl``. With ``hold``
    (``{rank: chunks}``) that rank blocks after that many chunks, holding its next one (the test kills it);
    the ranks in ``wait_go`` start once the store key ``go`` is set."""
    c = spec["cursor"]
    x_all, y_all = tiny_batch(torch, 0, c["n_samples"], seed=spec.get("data_seed", 0))
    store = ctx.store()
    cursor = GlobalCursor(store, c["n_samples"], c["chunk_size"], owner=f"{ctx.rank}:{os.getpid()}",
                          lease_s=c["lease_s"])
    hold, done = spec.get("hold", {}).get(str(ctx.rank)), 0
    if ctx.rank in spec.get("wait_go", ()):
        store.wait(["go"])
    with open(Path(spec["out"]) / f"rank-{ctx.rank}.jsonl", "a") as out:
        for pass_ in range(c["passes"]):
            while (chunk := cursor.claim(pass_, timeout_s=60)) is not None:
                if hold is not None and done == hold:
                    store.set("holding", f"{chunk.pass_}/{chunk.index}")
                    time.sleep(600)  # killed here
                index = torch.from_numpy(chunk.samples)
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(module(x_all[index]), y_all[index]).backward()
                optimizer.step()
                if cursor.done(chunk):
                    out.write(json.dumps({"pass": pass_, "chunk": chunk.index, "samples": chunk.samples.tolist()})
                              + "\n")
                    out.flush()
                    done += 1
    return {}


def train_steps(spec: dict, ctx: LearnerContext, model: torch.nn.Module, module: torch.nn.Module,
                optimizer: torch.optim.Optimizer) -> dict:
    """``steps`` steps on per-rank slices of the same global batches; the parameters after ``snapshots`` steps."""
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
    return snapshots


if __name__ == "__main__":
    main()
