"""The health figure of a session: queue depth over time (top), publish rate vs consume rate (bottom)."""

from __future__ import annotations

import json
from pathlib import Path

from labswarm.errors import LabswarmError


def read_log(path: str | Path) -> list[dict]:
    """The decisions of a session, as written by :class:`~labswarm.health.loop.HealthLoop`.

    Raises:
        LabswarmError: the log is missing or empty.
    """
    path = Path(path)
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise LabswarmError(f"cannot read the health log {path}: {exc.strerror or exc}") from exc
    if not rows:
        raise LabswarmError(f"the health log {path} is empty")
    return rows


def plot_session(log_path: str | Path, out: str | Path, title: str | None = None) -> Path:
    """Draw the two-panel health figure of a session as a PNG.

    Top: messages waiting in the queue over time (s). Bottom: the publish rate set by the controller and the
    measured publish and consume rates (tasks/s).

    Returns:
        The PNG's path.

    Raises:
        LabswarmError: the log is missing or empty.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_log(log_path)
    t = [r["t"] for r in rows]
    # fixed margins, not constrained_layout: its layout pass measured every text a second time, ~40 % of the
    # figure's time (0.23 -> 0.13-0.16 s at load ~5), drawn at the end of every `labswarm run` (issue 27); the
    # margins hold 6-digit tick labels (larger ones get an offset) and the axis labels
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    fig.subplots_adjust(left=0.11, right=0.98, bottom=0.09, top=0.93, hspace=0.06)
    top.plot(t, [r["depth"] for r in rows], color="tab:blue")
    top.set_ylabel("queue depth (messages)")
    top.grid(alpha=0.3)
    bottom.step(t, [r["new_rate"] for r in rows], where="post", color="tab:orange", label="publish rate (set)")
    bottom.plot(t, [r["publish_rate"] if r["publish_rate"] is not None else float("nan") for r in rows],
                color="tab:orange", alpha=0.5, linestyle="--", label="publish rate (measured)")
    bottom.plot(t, [r["consume_rate"] for r in rows], color="tab:green", label="consume rate (measured)")
    bottom.set_ylabel("tasks/s")
    bottom.set_xlabel("time (s)")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper right")
    fig.suptitle(title or Path(log_path).stem)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
