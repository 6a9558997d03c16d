"""The figures of ``labswarm compare`` (:mod:`labswarm.compare.run`): per-rank epoch records from a job's event
stream, one row per run (framework × learners), the Markdown table and the plots.

A run's row comes from its ranks' epoch records (:func:`summarize`). Through a job (:func:`rank_records`) rank 0's
records are its ``metric`` events (it alone validates and reports metrics); every other rank's are its last
``progress`` event of each epoch (the epoch's own figures, with its cumulative ``comm``: ``CommStats.as_dict()``,
see :mod:`labswarm.jobs.learner.hooks`); wall time is counted from the job's ``running`` status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from labswarm.errors import LabswarmError


class CompareError(LabswarmError):
    """A run of the comparison failed, timed out, or left no epoch record."""


def _stamp(data: Mapping[str, Any]) -> float | None:
    stamp = data.get("stamp")
    return datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else None


def rank_records(events: Iterable[Mapping[str, Any]], learners: int) -> list[list[dict[str, Any]]]:
    """Per rank, its epoch records from a job's event stream (``{id, event, data}`` as
    :meth:`~labswarm.jobs.client.client.JobsClient.events` yields them).

    Args:
        events: the job's events, in stream order.
        learners: the job's learners (``N``).

    Returns:
        ``N`` lists, one record per epoch rank 0 reported, each with ``epoch``, ``elapsed_s`` (s from the job's
        ``running`` status to the rank's end of that epoch), ``samples`` (the rank's in that epoch),
        ``epoch_s`` (its training seconds in that epoch), ``train_loss``, ``comm`` (cumulative: the rank's last
        one seen; rank 0's while a rank has sent none) and, rank 0 only, ``data_wait_s``, ``val_accuracy`` and
        ``val_loss``. A rank with no step in an epoch counts 0 samples there.

    Raises:
        CompareError: the stream has no metric record.
    """
    start: float | None = None
    metrics: dict[int, tuple[dict[str, Any], float | None]] = {}
    finals: dict[tuple[int, int], tuple[dict[str, Any], float | None]] = {}
    for event in events:
        kind, data = event["event"], event["data"]
        at = _stamp(data)
        if start is None and (kind == "status" and data.get("status") == "running"):
            start = at
        if kind == "metric" and "epoch" in data:
            metrics[int(data["epoch"])] = (dict(data), at)
        elif kind == "progress" and "epoch" in data:
            finals[(int(data.get("rank", 0)), int(data["epoch"]))] = (dict(data), at)  # the last one is the end
    if not metrics:
        raise CompareError("the job reported no epoch metrics")
    start = start if start is not None else min(at for _, at in metrics.values() if at is not None)
    out: list[list[dict[str, Any]]] = [[] for _ in range(learners)]
    comm: dict[int, dict[str, Any]] = {}  # each rank's last cumulative CommStats seen
    for epoch in sorted(metrics):
        record, at = metrics[epoch]
        elapsed = at - start if at is not None and start is not None else None
        samples = int(record.get("samples") or 0)
        out[0].append({"epoch": epoch, "elapsed_s": elapsed, "samples": samples,
                       "epoch_s": record.get("epoch_s"), "data_wait_s": record.get("data_wait_s") or 0.0,
                       "train_loss": record.get("train_loss"),
                       "val_accuracy": record.get("val_accuracy"), "val_loss": record.get("val_loss"),
                       "comm": record.get("comm") or {}})
        for rank in range(1, learners):
            progress, seen_at = finals.get((rank, epoch), ({}, None))
            if progress.get("comm"):
                comm[rank] = progress["comm"]
            n = int(progress.get("samples") or 0)
            rate = progress.get("samples_per_s")
            out[rank].append({"epoch": epoch, "samples": n,
                              "elapsed_s": seen_at - start if seen_at is not None and start is not None else elapsed,
                              "epoch_s": n / rate if n and rate else 0.0, "train_loss": progress.get("loss"),
                              "comm": comm.get(rank) or record.get("comm") or {}})
    return out


def _compact(topology: Any) -> str:
    """A topology in a label: ``2x2 workers/1x1 servers`` (worker groups × workers, server groups × shards; a
    colocated server group's shards live in its workers)."""
    if not isinstance(topology, Mapping):
        return str(topology)
    shards = topology.get("shards_per_group") or (1 if topology.get("colocated") is False else "w")
    return (f"{topology.get('worker_groups')}x{topology.get('workers_per_group')} workers/"
            f"{topology.get('server_groups', 1)}x{shards} servers")


def summarize(name: str, ranks: list[list[dict[str, Any]]], target: float,
              params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One run's row and curves from its ranks' epoch records.

    Args:
        name: the framework (``labswarm``: the single-process trainer of a one-learner job).
        ranks: per rank, its epoch records (:func:`rank_records`, or a learner's ``metrics.jsonl``).
        target: the validation accuracy whose first reach is timed.
        params: the framework's parameters other than its name (recorded, and shown in the label).

    Returns:
        ``framework``, ``learners``, ``label`` (``name(params) ×N``), ``params``, ``epochs`` (per epoch:
        ``elapsed_s`` (the slowest rank's), ``samples`` (all ranks, cumulative), ``train_loss`` (sample-weighted
        over ranks), ``val_accuracy``, ``val_loss`` (rank 0)), ``final_val_accuracy``, ``target``,
        ``time_to_target_s`` (``None``: never reached), ``samples_per_s`` (all ranks' samples over the slowest
        rank's compute seconds: the sum of its ``epoch_s`` less its ``data_wait_s``, the time the single-process
        trainer waited for its data pipeline, which the distributed mode, its features in memory, never does;
        over the last ``elapsed_s`` when records have no ``epoch_s``), ``wall_s``, ``data_wait_s`` (all ranks),
        ``bytes_sent_per_learner``, ``staleness_p50`` / ``staleness_p99`` (asynchronous frameworks: the worst
        rank's).

    Raises:
        CompareError: no epoch record.
    """
    epochs, total = [], 0
    for records in zip(*ranks, strict=False):
        seen = sum(int(r.get("samples") or 0) for r in records)
        total += seen
        times = [r["elapsed_s"] for r in records if r.get("elapsed_s") is not None]
        weighted = [(r["train_loss"], int(r.get("samples") or 0)) for r in records if r.get("train_loss") is not None]
        epochs.append({"epoch": records[0]["epoch"], "elapsed_s": max(times) if times else None, "samples": total,
                       "train_loss": (sum(v * n for v, n in weighted) / max(sum(n for _, n in weighted), 1)
                                      if weighted else None),
                       "val_accuracy": records[0].get("val_accuracy"), "val_loss": records[0].get("val_loss")})
    if not epochs:
        raise CompareError(f"{name}: no epoch record")
    reached = [e["elapsed_s"] for e in epochs if (e["val_accuracy"] or 0.0) >= target]
    wall = epochs[-1]["elapsed_s"] or 0.0
    if all(r.get("epoch_s") is not None for records in ranks for r in records):
        busy = max(sum(float(r["epoch_s"]) - float(r.get("data_wait_s") or 0.0) for r in records)
                   for records in ranks)
    else:
        busy = wall
    comm = [(records[-1].get("comm") or {}) if records else {} for records in ranks]
    params = {k: v for k, v in (params or {}).items() if k != "name"}
    shown = ",".join(f"{k}={_compact(v) if k == 'topology' else v}" for k, v in params.items())
    row = {"framework": name, "learners": len(ranks), "params": params,
           "label": f"{name}{f'({shown})' if shown else ''} ×{len(ranks)}", "epochs": epochs,
           "final_val_accuracy": epochs[-1]["val_accuracy"], "target": target,
           "time_to_target_s": reached[0] if reached else None,
           "samples_per_s": total / busy if busy else 0.0, "wall_s": wall,
           "data_wait_s": sum(float(r.get("data_wait_s") or 0.0) for records in ranks for r in records),
           "bytes_sent_per_learner": sum(c.get("bytes_sent", 0) for c in comm) / max(len(comm), 1)}
    if any("staleness_p50" in c for c in comm):
        row["staleness_p50"] = max(c.get("staleness_p50", 0) for c in comm)
        row["staleness_p99"] = max(c.get("staleness_p99", 0) for c in comm)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown table, one line per row (run)."""
    lines = ["| framework | learners | final val acc | time to target (s) | samples/s | MB sent / learner | "
             "staleness p50 / p99 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["final_val_accuracy"] is None else f"{r['final_val_accuracy']:.3f}"
        ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        stale = f"{r['staleness_p50']} / {r['staleness_p99']}" if "staleness_p50" in r else "-"
        name = r.get("label", r["framework"]).rsplit(" ×", 1)[0]
        lines.append(f"| {name} | {r.get('learners', '-')} | {acc} | {ttt} | {r['samples_per_s']:.1f} | "
                     f"{r['bytes_sent_per_learner'] / 1e6:.2f} | {stale} |")
    return "\n".join(lines) + "\n"


def scaling(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Samples/s against learners, per framework: ``{name: [(learners, samples/s), ...]}`` sorted by learners.
    The one-learner run (framework ``labswarm``, the single-process trainer every framework reduces to) is the
    first point of every framework's line."""
    single = [(1, r["samples_per_s"]) for r in rows if r["learners"] == 1]
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["learners"] > 1:
            lines.setdefault(r.get("label", r["framework"]).rsplit(" ×", 1)[0], list(single)).append(
                (r["learners"], r["samples_per_s"]))
    return {name: sorted(points) for name, points in lines.items()}


def plot(rows: list[dict[str, Any]], output: Path) -> list[Path]:
    """``loss.png`` (training loss against wall time and against samples seen), ``accuracy.png`` (validation
    accuracy, the same axes), one curve per row, and ``scaling.png`` (samples/s against learners, one line per
    framework) when a framework ran with more than one learner count or beside a one-learner run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, label, name in (("train_loss", "training loss", "loss.png"),
                             ("val_accuracy", "validation accuracy", "accuracy.png")):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for r in rows:
            points = [e for e in r["epochs"] if e[key] is not None and e["elapsed_s"] is not None]
            for ax, x in zip(axes, ("elapsed_s", "samples"), strict=True):
                ax.plot([e[x] for e in points], [e[key] for e in points], marker="o",
                        label=r.get("label", r["framework"]))
        for ax, x in zip(axes, ("wall time since the job ran (s)", "samples seen (all learners)"), strict=True):
            ax.set_xlabel(x)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(output / name, dpi=90)
        plt.close(fig)
        paths.append(output / name)
    lines = {k: v for k, v in scaling(rows).items() if len(v) > 1}
    if lines:
        fig, ax = plt.subplots(figsize=(5, 4))
        for name, points in lines.items():
            ax.plot([n for n, _ in points], [v for _, v in points], marker="o", label=name)
        ax.set_xlabel("learners")
        ax.set_ylabel("training samples/s (all learners)")
        ax.set_xticks(sorted({n for points in lines.values() for n, _ in points}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(output / "scaling.png", dpi=90)
        plt.close(fig)
        paths.append(output / "scaling.png")
    return paths
