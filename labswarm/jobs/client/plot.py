"""A training job's learning curves as a PNG (``labswarm jobs plot JOB``): the DLaaS paper's figure 1.

Four panels from the job's metrics records (``GET /v1/jobs/{id}/metrics``, each epoch once): loss (train and
validation) and accuracy (train and validation) against the epoch on top, the same against wall time below.
Wall time is seconds since training began: each record's ``time`` (when the epoch ended; the trainer writes it,
ISO 8601 to the second) minus the first record's, less the first epoch's own ``epoch_s``; a record without
``time`` (a ``command`` learner's, say) has no point on the lower panels. A restarted attempt's pause shows as a
gap in wall time, as it should. A metric a record lacks is no point (never a zero).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from labswarm.errors import LabswarmError

#: The curves: (metric, panel, label). Panels: ``loss`` and ``accuracy``.
CURVES = (("train_loss", "loss", "train"), ("val_loss", "loss", "validation"),
          ("train_accuracy", "accuracy", "train"), ("val_accuracy", "accuracy", "validation"))


@dataclass
class Plotted:
    """What :func:`plot_metrics` drew.

    Attributes:
        path: the PNG.
        lines: ``{"<panel> vs <axis>/<label>": [(x, y), ...]}`` for every curve drawn, e.g.
            ``"loss vs epoch/train"`` or ``"accuracy vs wall time/validation"``; x in epochs (from 1) or seconds.
    """

    path: Path
    lines: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def wall_times(records: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Seconds since training began at the end of each record's epoch (see the module docstring); ``None`` for
    a record without a readable ``time``."""
    stamps: list[datetime | None] = []
    for record in records:
        try:
            stamps.append(datetime.fromisoformat(str(record["time"])))
        except (KeyError, ValueError):
            stamps.append(None)
    first = next((i for i, s in enumerate(stamps) if s is not None), None)
    if first is None:
        return [None] * len(records)
    start = stamps[first].timestamp() - float(records[first].get("epoch_s") or 0.0)  # type: ignore[union-attr]
    return [None if s is None else s.timestamp() - start for s in stamps]


def plot_metrics(records: Sequence[Mapping[str, Any]], out: str | Path, title: str | None = None) -> Plotted:
    """Draw the job's learning curves (four panels, see the module docstring) as a PNG.

    Args:
        records: the metrics records, in the order reported (each with ``epoch``; the curves' metrics where
            there are: ``train_loss``, ``val_loss``, ``train_accuracy``, ``val_accuracy``).
        out: the PNG's path (its folder is created).
        title: the figure's title.

    Returns:
        The path and the points of each curve drawn.

    Raises:
        LabswarmError: no record has an epoch and one of the curves' metrics.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if isinstance(r.get("epoch"), int | float)
            and any(isinstance(r.get(metric), int | float) for metric, _p, _l in CURVES)]
    if not rows:
        raise LabswarmError("nothing to plot: no metrics record with an epoch and a loss or an accuracy")
    times = wall_times(rows)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    plotted = Plotted(Path(out))
    axes_x: tuple[tuple[str, list[float | None]], ...] = (("epoch", [float(r["epoch"]) for r in rows]),
                                                         ("wall time", times))
    for row, (axis, xs) in enumerate(axes_x):
        for col, panel in enumerate(("loss", "accuracy")):
            ax = axes[row][col]
            for metric, curve_panel, label in CURVES:
                if curve_panel != panel:
                    continue
                points = [(float(x), float(r[metric])) for x, r in zip(xs, rows, strict=True)
                          if x is not None and isinstance(r.get(metric), int | float)]
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
                    plotted.lines[f"{panel} vs {axis}/{label}"] = points
            ax.set_xlabel("epoch" if axis == "epoch" else "wall time (s)")
            ax.set_ylabel("cross-entropy loss" if panel == "loss" else "accuracy")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(loc="best")
    fig.suptitle(title or "learning curves")
    plotted.path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plotted.path, dpi=100)
    plt.close(fig)
    return plotted
