"""``labswarm compare``: the same experiment trained under each framework, side by side (SINGA's "unified platform
for verifying the performance of different frameworks (convergence rate, computation time) under the same
environmental setting").

Every framework gets the same model, data, seed, epochs (the sample budget: epochs × the training split),
per-learner batch and schedule; its learners are local processes (:mod:`labswarm.learners.learner`) started with
:func:`~labswarm.learners.launch.plan_attempt`'s environments, after the shards it plans, against a
:class:`~labswarm.learners.launch.JobCoordinator` hosted here. Frameworks run one after another, never side by
side. Output folder: ``compare.json`` (every figure), ``compare.md`` (the table) and ``accuracy.png`` /
``loss.png`` (validation accuracy and training loss against wall time and against samples seen, one curve per
framework).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labswarm.errors import ConfigError, LabswarmError
from labswarm.learners.launch import JobCoordinator, plan_attempt

#: Seconds one framework's run may take before its processes are killed.
RUN_TIMEOUT_S = 1800.0
#: The folder of a manager's home where runs go by default, one folder each (the dashboard lists them).
COMPARE_DIR = "compare"


class CompareError(LabswarmError):
    """A learner or shard of a framework's run failed or timed out."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a process writing its output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def _wait(procs: Sequence[subprocess.Popen], deadline: float, what: str, logs: Path) -> None:
    for proc in procs:
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CompareError(f"{what} did not finish in time; logs in {logs}") from None
        if code != 0:
            raise CompareError(f"{what} exited {code}; logs in {logs}")


def run_framework(experiment: Path, framework: dict[str, Any], learners: int, home: Path,
                  epochs: int | None = None, ps_shards: int = 1, timeout_s: float = RUN_TIMEOUT_S,
                  threads: int = 1) -> list[list[dict[str, Any]]]:
    """Train ``experiment`` under ``framework`` with ``learners`` local learner processes (and ``ps_shards``
    shards when it needs a server); wait for them.

    Returns:
        Per rank, its epoch records (``metrics.jsonl``).

    Raises:
        ConfigError: an unknown framework, bad parameters or fewer than 2 learners.
        CompareError: a process failed or the run took longer than ``timeout_s`` seconds.
    """
    shutil.rmtree(home, ignore_errors=True)  # a fresh run: no metrics of an earlier one are read back
    home.mkdir(parents=True)
    coordinator = JobCoordinator()
    ps = [("127.0.0.1", _free_port()) for _ in range(ps_shards)]
    plans = plan_attempt(framework, learners, 1, ("127.0.0.1", coordinator.port), ps, home / "ps")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + timeout_s
    try:
        learner_procs = []
        for plan in plans:
            if plan.kind == "ps":
                ready = home / f"ps-{plan.index}.port"
                procs.append(_start([*plan.argv, "--ready-file", str(ready)], env, home / f"ps-{plan.index}.log"))
                while not ready.exists():  # the lifecycle's order: shards listen before learners start
                    if procs[-1].poll() is not None or time.monotonic() > deadline:
                        raise CompareError(f"parameter-server shard {plan.index} did not start; logs in {home}")
                    time.sleep(0.05)
                continue
            argv = [sys.executable, "-m", "labswarm.learners.learner", str(experiment), "--home", str(home),
                    "--framework", json.dumps(framework), "--threads", str(threads)]
            if epochs is not None:
                argv += ["--epochs", str(epochs)]
            learner_procs.append(_start(argv, {**env, **plan.env}, home / f"learner-{plan.index}.log"))
        procs += learner_procs
        _wait(learner_procs, deadline, f"a learner of {framework['name']}", home)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        del coordinator
    runs = sorted((home / "train").glob("*/rank-*/metrics.jsonl"), key=lambda p: int(p.parent.name[5:]))
    return [[json.loads(line) for line in p.read_text().splitlines() if line.strip()] for p in runs]


def summarize(name: str, ranks: list[list[dict[str, Any]]], target: float) -> dict[str, Any]:
    """One framework's row and curves from its ranks' epoch records.

    Returns:
        ``framework``, ``epochs`` (per epoch: ``elapsed_s`` (the slowest rank's), ``samples`` (all ranks,
        cumulative), ``train_loss`` (sample-weighted over ranks), ``val_accuracy``, ``val_loss`` (rank 0)),
        ``final_val_accuracy``, ``time_to_target_s`` (``None``: never reached), ``samples_per_s``,
        ``bytes_sent_per_learner``, ``staleness_p50`` / ``staleness_p99`` (asynchronous frameworks).
    """
    epochs, total = [], 0
    for records in zip(*ranks, strict=False):
        seen = sum(r["samples"] for r in records)
        total += seen
        epochs.append({"epoch": records[0]["epoch"], "elapsed_s": max(r["elapsed_s"] for r in records),
                       "samples": total,
                       "train_loss": sum(r["train_loss"] * r["samples"] for r in records) / max(seen, 1),
                       "val_accuracy": records[0].get("val_accuracy"), "val_loss": records[0].get("val_loss")})
    if not epochs:
        raise CompareError(f"{name}: no epoch record")
    reached = [e["elapsed_s"] for e in epochs if (e["val_accuracy"] or 0.0) >= target]
    comm = [r[-1]["comm"] for r in ranks]
    row = {"framework": name, "learners": len(ranks), "epochs": epochs,
           "final_val_accuracy": epochs[-1]["val_accuracy"], "target": target,
           "time_to_target_s": reached[0] if reached else None,
           "samples_per_s": total / epochs[-1]["elapsed_s"] if epochs[-1]["elapsed_s"] else 0.0,
           "bytes_sent_per_learner": sum(c["bytes_sent"] for c in comm) / len(comm)}
    if any("staleness_p50" in c for c in comm):
        row["staleness_p50"] = max(c.get("staleness_p50", 0) for c in comm)
        row["staleness_p99"] = max(c.get("staleness_p99", 0) for c in comm)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown table."""
    lines = ["| framework | final val acc | time to target (s) | samples/s | MB sent / learner | staleness p50 / p99 |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["final_val_accuracy"] is None else f"{r['final_val_accuracy']:.3f}"
        ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        stale = f"{r['staleness_p50']} / {r['staleness_p99']}" if "staleness_p50" in r else "-"
        lines.append(f"| {r['framework']} | {acc} | {ttt} | {r['samples_per_s']:.1f} | "
                     f"{r['bytes_sent_per_learner'] / 1e6:.2f} | {stale} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], output: Path) -> list[Path]:
    """``accuracy.png`` and ``loss.png``: each against wall time and samples seen, one curve per framework."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, label, name in (("val_accuracy", "validation accuracy", "accuracy.png"),
                             ("train_loss", "training loss", "loss.png")):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for r in rows:
            points = [e for e in r["epochs"] if e[key] is not None]
            for ax, x in zip(axes, ("elapsed_s", "samples"), strict=True):
                ax.plot([e[x] for e in points], [e[key] for e in points], marker="o", label=r["framework"])
        for ax, x in zip(axes, ("wall time (s)", "samples seen (all learners)"), strict=True):
            ax.set_xlabel(x)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(output / name, dpi=90)
        plt.close(fig)
        paths.append(output / name)
    return paths


def default_output(home: Path, now: float | None = None) -> Path:
    """Where ``labswarm compare`` writes when not told: ``<home>/compare/<UTC stamp>`` beside a manager's home
    (``home``, ``LABSWARM_HOME``, is a folder: the dashboard's ``/ui/compare`` lists the runs there), else
    ``./compare``."""
    if not Path(home).is_dir():
        return Path(COMPARE_DIR)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return Path(home) / COMPARE_DIR / stamp


def compare(experiment: Path, frameworks: Sequence[str], output: Path, learners: int = 2,
            epochs: int | None = None, target: float = 0.8, ps_shards: int = 1,
            owner: str | None = None) -> list[dict[str, Any]]:
    """Run each framework in turn and write ``compare.json``, ``compare.md`` and the plots into ``output``.

    Args:
        experiment: the experiment YAML (with ``model`` and ``training``).
        frameworks: framework names, each with its default parameters.
        output: the output folder (each framework's run in ``output/runs/<name>/``).
        learners: learner processes per framework (≥ 2).
        epochs: override ``training.epochs``.
        target: the validation accuracy whose first reach is timed.
        ps_shards: parameter-server shards for the frameworks that need them.
        owner: recorded in ``compare.json``: that user may see the run on the dashboard (admins see all).

    Returns:
        The rows (:func:`summarize`), in ``frameworks`` order.

    Raises:
        ConfigError: no framework, an unknown one, or fewer than 2 learners (named by field).
        CompareError: a run failed.
    """
    if not frameworks:
        raise ConfigError([("frameworks", "name at least one framework")])
    rows = []
    for name in frameworks:
        home = output / "runs" / name
        ranks = run_framework(Path(experiment).resolve(), {"name": name}, learners, home, epochs, ps_shards)
        rows.append(summarize(name, ranks, target))
    output.mkdir(parents=True, exist_ok=True)
    (output / "compare.json").write_text(json.dumps({"experiment": str(experiment), "learners": learners,
                                                     "epochs": epochs, "owner": owner, "rows": rows}, indent=1))
    (output / "compare.md").write_text(table(rows))
    plot(rows, output)
    return rows
