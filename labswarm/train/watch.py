"""Watching a metric over epochs: the best epoch, plateaus, and early stopping (``training.early_stopping``).

After each epoch :meth:`Watch.update` compares the watched metric (:attr:`TrainingConfig.watch
<labswarm.config.training.TrainingConfig.watch>`) with the best so far: an improvement is a change past
``min_delta`` in the ``mode``'s direction. The epoch on which ``patience`` epochs in a row have not improved is a
**plateau**: its record gets a ``plateau`` entry (a job's learner sends it as a ``plateau`` event), with early
stopping or without. With early stopping, that epoch is the last: the training ends as completed and the model
written is the best epoch's (its weights kept in ``best.pt`` of the run folder whenever an epoch improves, so a
resumed run has them too). Every record gets ``best_epoch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labswarm.config.training import TrainingConfig
from labswarm.train import checkpoint


class Watch:
    """The watched metric's best value and epoch, and the epochs since.

    Args:
        training: the training section (its ``watch`` and ``early_stopping``).
        run_dir: the run folder (``best.pt`` is written there when early stopping).
    """

    def __init__(self, training: TrainingConfig, run_dir: Path) -> None:
        self.config = training.watch
        self.stops = training.early_stopping is not None
        self.best_path = run_dir / "best.pt"
        self.best: float | None = None
        self.best_epoch = 0
        self.since = 0  # epochs without improvement
        self.stopped = False  # early stopping ended the training

    def update(self, record: dict[str, Any], model: Any) -> None:
        """Take the epoch ``record`` (in place: ``best_epoch``, and ``plateau`` / ``early_stop`` when they
        happen); a record without the metric (a learner that does not validate) changes nothing."""
        value = record.get(self.config.metric)
        if value is None or not math.isfinite(float(value)):
            return
        value, sign = float(value), (1.0 if self.config.mode == "max" else -1.0)
        if self.best is None or sign * (value - self.best) > self.config.min_delta:
            self.best, self.best_epoch, self.since = value, int(record["epoch"]), 0
            if self.stops:
                checkpoint.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, self.best_path)
        else:
            self.since += 1
        record["best_epoch"] = self.best_epoch
        if self.since == self.config.patience or (self.stops and self.since > self.config.patience):  # live change
            self.stopped = self.stops
            record["plateau"] = {"metric": self.config.metric, "mode": self.config.mode, "best": self.best,
                                 "best_epoch": self.best_epoch, "epochs_without_improvement": self.since,
                                 "early_stop": self.stops}
            if self.stops:
                record["early_stop"] = True

    def best_weights(self, model: Any) -> dict[str, Any]:
        """The model's weights to write: the best epoch's when early stopping (the last ones otherwise), on the
        CPU."""
        if self.stops and self.best_path.is_file():
            return dict(checkpoint.load(self.best_path))
        return {k: v.cpu() for k, v in model.state_dict().items()}

    def best_record(self, records: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The record of the epoch whose weights :meth:`best_weights` gives."""
        if self.stops and self.best_epoch:
            return next((r for r in records if r.get("epoch") == self.best_epoch), None)
        return records[-1] if records else None

    def state_dict(self) -> dict[str, Any]:
        """Where the watch stands, for the checkpoint."""
        return {"best": self.best, "best_epoch": self.best_epoch, "since": self.since, "stopped": self.stopped}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (``None``: a checkpoint without one, from before)."""
        if state:
            self.best, self.best_epoch = state["best"], int(state["best_epoch"])
            self.since, self.stopped = int(state["since"]), bool(state["stopped"])
