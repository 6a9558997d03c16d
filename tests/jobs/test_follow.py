"""The renderer of ``jobs submit --follow``, ``jobs logs -f`` and ``labswarm run`` on a recorded event stream: a
bar per epoch (and per attempt: a restart mid-epoch draws the epoch again), every log line once, in order."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from labswarm.jobs.client.follow import epoch_line, follow


def _stream() -> list[dict[str, Any]]:
    """A job of 3 epochs of 4 steps whose learner crashed in epoch 2 and was restarted from its checkpoint."""
    events: list[dict[str, Any]] = []

    def add(kind: str, attempt: int | None, **data: Any) -> None:
        events.append({"id": len(events) + 1, "event": kind,
                       "data": {**data, "seq": len(events) + 1, "attempt": attempt,
                                "stamp": f"2026-11-24T10:00:{len(events):02d}+00:00"}})

    def epoch(attempt: int, k: int, steps: range, *, ends: bool = True) -> None:
        for step in steps:
            add("progress", attempt, rank=0, epoch=k, epochs=3, step=step, steps=4, samples=min(8 * step, 30),
                samples_total=30, samples_per_s=12.5, loss=1.0 / (k + step))
            add("progress", attempt, rank=1, epoch=k, epochs=3, step=step, steps=9, samples=1, samples_total=9,
                samples_per_s=1.0, loss=9.0)  # another learner's share: not a bar of its own
        add("log", attempt, rank=0, line=f"attempt {attempt}: epoch {k} [bold]done[/bold]" if ends else
            f"attempt {attempt}: epoch {k} interrupted")
        if ends:
            add("metric", attempt, rank=0, epoch=k, epochs=3, train_loss=0.5 / k, train_accuracy=0.6,
                val_accuracy=0.7 + k / 100, val_macro_f1=0.65, samples_per_s=12.5, data_wait_share=0.02, epoch_s=2.4)

    add("status", None, status="queued", reason="submitted")
    add("status", 1, status="running", reason="attempt 1 running")
    add("log", 1, rank=0, line="learner 0/1 of job j, attempt 1")
    epoch(1, 1, range(1, 5))
    epoch(1, 2, range(1, 3), ends=False)
    add("status", 1, status="pending", reason="attempt 1 crashed: restarting")
    add("status", 2, status="running", reason="attempt 2 running")
    epoch(2, 2, range(3, 5))
    epoch(2, 3, range(1, 5))
    add("log", 2, rank=0, line="learner exits with code 0")
    add("status", 2, status="completed", reason="completed")
    return events


def test_one_bar_per_epoch_and_attempt_and_every_log_line_once() -> None:
    events = _stream()
    console = Console(record=True, file=io.StringIO(), width=160)
    final = follow(events, console)
    text = console.export_text()
    lines = text.splitlines()
    assert final["status"] == "completed"
    bars = [line for line in lines if "━" in line]
    assert [b.split()[1] for b in bars] == ["1/3", "2/3", "2/3", "3/3"]  # epoch 2 once per attempt
    assert all("batches" in b and "samples/s" in b for b in bars) and not any("/9 samples" in b for b in bars)
    assert "4/4 batches  30/30 samples  12.5 samples/s  loss 0.2000  6 s" in bars[0]  # the last progress shown
    assert "2/4 batches" in bars[1] and "4/4 batches" in bars[2]  # interrupted at step 2, finished by attempt 2
    logs = [e["data"]["line"] for e in events if e["event"] == "log"]
    assert [line for line in lines if line in logs] == logs  # every log line once, in order, markup kept as text
    assert "attempt 1: epoch 1 [bold]done[/bold]" in lines
    metrics = [epoch_line(e["data"]) for e in events if e["event"] == "metric"]
    assert [line for line in lines if line in metrics] == metrics
    assert metrics[0].startswith("epoch 1/3  loss 0.500  train acc 0.600  val acc 0.710")
    # things come in the order they happened: a bar ends before its epoch's metrics, statuses in between
    order = [i for i, line in enumerate(lines) if line in (bars[0], metrics[0], "PENDING  attempt 1 crashed: "
                                                            "restarting", bars[1], bars[2], "COMPLETED  completed")]
    assert [lines[i] for i in order] == [bars[0], metrics[0], bars[1], "PENDING  attempt 1 crashed: restarting",
                                         bars[2], "COMPLETED  completed"]


def test_a_command_learner_s_metrics_and_no_progress() -> None:
    console = Console(record=True, file=io.StringIO(), width=120)
    final = follow([{"id": 1, "event": "metric", "data": {"epoch": 1, "loss": 0.25, "seq": 1, "attempt": 1}},
                    {"id": 2, "event": "status", "data": {"status": "failed", "reason": "exit code 3"}}], console)
    assert final["status"] == "failed"
    assert console.export_text().strip().splitlines() == ["metrics  epoch 1  loss 0.25", "FAILED  exit code 3"]
