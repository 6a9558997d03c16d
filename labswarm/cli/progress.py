"""The progress of a long phase of work (the demo set's build, the features of a run), shown for a person or for
a log.

On a terminal it is a live rich bar: done/total, rate, failures, elapsed time and ETA. When the output is not a
terminal (piped, redirected to a file, run by CI or systemd) a bar means nothing: the same figures come as a
plain line every :data:`LOG_EVERY_S` seconds, and once more when the phase ends, e.g.::

    features music_speech_noise: 1210/2700 (44.8%), 9.8 samples/s, 2 failed, elapsed 2m03s, ETA 2m32s
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: Seconds between two progress lines when the output is not a terminal.
LOG_EVERY_S = 5.0


def duration(seconds: float) -> str:
    """``seconds`` as ``1h02m03s``, ``2m03s`` or ``7s``."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Phase:
    """The progress of one phase: a live bar on a terminal, plain lines otherwise (see the module).

    Use it as a context manager and call :meth:`update` as work gets done; nothing is shown before the first
    update (so a phase that fails at once leaves no empty bar behind).

    Args:
        name: what the phase is, e.g. ``features music_speech_noise``.
        console: where to show it.
        unit: what is counted, in the rate (``samples`` -> ``samples/s``).
        every: seconds between two plain lines.
        lines: force plain lines (``True``) or the bar (``False``); default: lines unless ``console`` is a terminal.
        clock: the time source, in seconds (tests give their own).
    """

    def __init__(self, name: str, console: Console, *, unit: str = "samples", every: float = LOG_EVERY_S,
                 lines: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.console = console
        self.unit = unit
        self.every = every
        self.lines = not console.is_terminal if lines is None else lines
        self.clock = clock
        self.started = clock()
        self._state: tuple[int, int | None, float | None, int] | None = None  # done, total, rate, failed
        self._shown: tuple[int, int | None, float | None, int] | None = None  # the last line printed
        self._shown_at = self.started
        self._bar: tuple[Progress, TaskID] | None = None

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def update(self, done: int, total: int | None, *, rate: float | None = None, failed: int = 0) -> None:
        """The phase has ``done`` of ``total`` units (``None``: not known yet), ``failed`` of them failed;
        ``rate`` in units/s (default: ``done`` over the elapsed time)."""
        self._state = (done, total, rate, failed)
        if not self.lines:
            self._draw()
        elif self.clock() - self._shown_at >= self.every:
            self._print()

    def line(self) -> str:
        """The current progress as one plain line (see the module)."""
        done, total, rate, failed = self._state or (0, None, None, 0)
        elapsed = self.clock() - self.started
        rate = rate if rate is not None else (done / elapsed if elapsed > 0 else 0.0)
        parts = [f"{done}/{total} ({100 * done / total:.1f}%)" if total else f"{done}/?",
                 f"{rate:.1f} {self.unit}/s"]
        if failed:
            parts.append(f"{failed} failed")
        parts.append(f"elapsed {duration(elapsed)}")
        if total and rate > 0 and done < total:
            parts.append(f"ETA {duration((total - done) / rate)}")
        return f"{self.name}: {', '.join(parts)}"

    def stop(self) -> None:
        """End the phase: the bar stays drawn in its final state; in plain lines, the last figures are printed
        unless they already were."""
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None
        elif self.lines and self._state is not None and self._state != self._shown:
            self._print()

    def _print(self) -> None:
        self.console.print(self.line(), highlight=False, markup=False, soft_wrap=True)
        self._shown, self._shown_at = self._state, self.clock()

    def _draw(self) -> None:
        done, total, rate, failed = self._state or (0, None, None, 0)
        if self._bar is None:
            bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>7.1f} " + self.unit + "/s"),
                TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=self.console, transient=False)
            bar.start()
            self._bar = bar, bar.add_task(self.name, total=total, rate=0.0, failed=0)
        bar, task = self._bar
        elapsed = bar.tasks[0].elapsed or 1e-9
        bar.update(task, completed=done, total=total, failed=failed, rate=rate if rate is not None else done / elapsed)
