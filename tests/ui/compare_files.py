"""A ``compare.json`` as ``labswarm compare`` writes it (rows made by its own :func:`summarize`), without running
the learners: for the dashboard's comparison pages."""

from __future__ import annotations

import json
from pathlib import Path

from labswarm.compare.run import default_output, summarize


def write_compare(home: Path, frameworks: tuple[str, ...] = ("allreduce", "downpour"), epochs: int = 3,
                  owner: str | None = None, run: str | None = None) -> Path:
    """Write ``<home>/compare/<run>/compare.json`` (``run``: the CLI's default stamp) for two learners per
    framework and ``epochs`` epochs with distinct made-up curves; returns the run's folder."""
    rows = []
    for k, name in enumerate(frameworks):
        ranks = [[{"epoch": e, "elapsed_s": 10.0 * e + 3 * k + rank, "samples": 100,
                   "train_loss": 1.0 / (e + k), "val_accuracy": min(1.0, 0.4 + 0.15 * e - 0.05 * k),
                   "val_loss": 1.2 / (e + k), "comm": {"bytes_sent": 1e6 * (k + 1)}}
                  for e in range(1, epochs + 1)] for rank in range(2)]
        rows.append(summarize(name, ranks, target=0.8))
    folder = home / "compare" / run if run else default_output(home)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_text(json.dumps({"experiment": "examples/tiny.yml", "learners": 2,
                                                     "epochs": epochs, "owner": owner, "rows": rows}))
    return folder
