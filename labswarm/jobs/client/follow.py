"""Following a job on its event stream: the live log lines, a progress bar per epoch below them, each epoch's
metrics and the status changes (rich).

One renderer for ``labswarm jobs submit --follow``, ``labswarm jobs logs -f`` and ``labswarm run`` (which trains
through a job of its manager), so they all show a job alike. Events are the dicts
:meth:`~labswarm.jobs.client.client.JobsClient.events` yields (``{id, event, data}``):

- ``log``: the line, printed once, above the bars;
- ``progress`` (rank 0's; see :mod:`labswarm.jobs.learner.hooks`): the bar of ``(attempt, epoch)``, created at its first
  progress event: ``epoch k/N``, batches done/total, samples done/total, samples/s, running loss. A bar ends when
  its epoch's metrics arrive, when another epoch or attempt starts, when the job changes status, or at the end;
  an ended bar is printed once, as it stands, and leaves the live area, so the screen holds one live bar and the
  scroll-back one line per epoch, in the order things happened;
- ``metric``: one line per record (the trainer's records in ``labswarm train``'s format);
- ``status``: ``COMPLETED  reason`` and the like; ``checkpoint`` and ``attempt`` events print nothing.

On a console that is no terminal (a file, a pipe, a recording) nothing is redrawn: every ended bar is printed once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

#: Fields of an event's data that are the stream's, not the metrics record's.
STREAM_FIELDS = ("seq", "stamp", "attempt", "rank")


def epoch_line(record: Mapping[str, Any]) -> str:
    """One epoch's metrics record as one line: the trainer's records (``train_loss``, ``val_accuracy`` ...) as
    ``labswarm train`` prints them, any other record (a ``command`` learner's) as ``metrics  name value ...``."""
    if "train_loss" in record and "epochs" in record:
        return (f"epoch {record['epoch']}/{record['epochs']}  loss {record['train_loss']:.3f}  "
                f"train acc {record.get('train_accuracy', float('nan')):.3f}  "
                f"val acc {record.get('val_accuracy', float('nan')):.3f}  "
                f"val F1 {record.get('val_macro_f1') or float('nan'):.3f}  "
                f"{record.get('samples_per_s', 0.0):.0f} samples/s  "
                f"waiting for data {100 * record.get('data_wait_share', 0.0):.1f} %  "
                f"({record.get('epoch_s', 0.0):.0f} s)")
    fields = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()
                       if k not in STREAM_FIELDS and isinstance(v, int | float) and not isinstance(v, bool))
    return f"metrics  {fields}"


class FollowRenderer:
    """Draws a job's events on a console (see the module docstring); a context manager around the live bars.

    Args:
        console: where to draw; default a new :class:`rich.console.Console` on stdout.

    Attributes:
        status: the data of the last ``status`` event seen (``{"status": "completed", ...}``), else ``None``.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}/{task.fields[epochs]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("batches  {task.fields[samples]}  {task.fields[rate]}  {task.fields[loss]}  "
                       "{task.fields[elapsed]}"), console=self.console, transient=True)
        self.status: dict[str, Any] | None = None
        self._bar: tuple[tuple[Any, int], TaskID] | None = None  # the live bar: ((attempt, epoch), task)
        self._began: datetime | None = None  # the learner's stamp of the live bar's first progress event

    def __enter__(self) -> FollowRenderer:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def handle(self, event: Mapping[str, Any]) -> None:
        """Draw one event."""
        kind, data = event["event"], event["data"]
        if kind == "log":
            self.console.print(data.get("line", ""), markup=False, highlight=False)
        elif kind == "progress":
            self._progress(data)
        elif kind == "metric":
            self._end_bar()
            self.console.print(epoch_line(data), markup=False, highlight=False)
        elif kind == "status":
            self._end_bar()
            self.console.print(f"[bold]{data['status'].upper()}[/bold]  {data.get('reason') or ''}", highlight=False)
            self.status = dict(data)

    def close(self) -> None:
        """End the live bar (printed as it stands) and stop drawing."""
        self._end_bar()
        self.progress.stop()

    def _progress(self, data: Mapping[str, Any]) -> None:
        if int(data.get("rank") or 0) != 0:
            return  # one bar per epoch: rank 0's share stands for the epoch
        key = (data.get("attempt"), int(data["epoch"]))
        samples = data.get("samples")
        fields = {
            "epoch": data["epoch"], "epochs": data.get("epochs", "?"),
            "samples": "" if samples is None else f"{samples}/{data.get('samples_total') or '?'} samples",
            "rate": "" if data.get("samples_per_s") is None else f"{data['samples_per_s']:.1f} samples/s",
            "loss": "" if data.get("loss") is None else f"loss {data['loss']:.4f}",
        }
        if self._bar is not None and self._bar[0] != key:
            self._end_bar()
        stamp = _stamp(data)
        if self._bar is None:
            self._began = stamp
        fields["elapsed"] = f"{(stamp - self._began).total_seconds():.0f} s" if stamp and self._began else ""
        if self._bar is None:
            self._bar = (key, self.progress.add_task("", total=data.get("steps"), **fields))
        self.progress.update(self._bar[1], completed=int(data.get("step") or 0), total=data.get("steps"), **fields)

    def _end_bar(self) -> None:
        if self._bar is None:
            return
        task = self._bar[1]
        self._bar = None
        self.progress.stop_task(task)
        self.console.print(self.progress.make_tasks_table([t for t in self.progress.tasks if t.id == task]))
        self.progress.remove_task(task)


def _stamp(data: Mapping[str, Any]) -> datetime | None:
    """When the learner made the event (the stream's ``stamp``), else ``None``."""
    try:
        return datetime.fromisoformat(data["stamp"])
    except (KeyError, TypeError, ValueError):
        return None


def follow(events: Iterable[Mapping[str, Any]], console: Console | None = None) -> dict[str, Any]:
    """Draw ``events`` (a job's stream) to their end with a :class:`FollowRenderer`.

    Returns:
        The data of the last ``status`` event (``{}`` when there was none).
    """
    with FollowRenderer(console) as renderer:
        for event in events:
            renderer.handle(event)
    return renderer.status or {}
