"""A three-class set that a small model learns in a few epochs: low tones, high tones, white noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import yaml
from helpers import SR

#: The learner processes' tests' pipeline: batches of 4 crops of 24 frames from one prefetch producer (36 training
#: samples: 9 chunks a pass).
LEARNER_PIPELINE = [{"name": "source"}, {"name": "shuffle"}, {"name": "features"},
                    {"name": "batch", "size": 4, "frames": 24}, {"name": "prefetch", "producers": 1}]


def write_three_classes(root: Path, per_class: int = 8, seconds: float = 1.0) -> Path:
    """``per_class`` clips per class (each clip its own source) and ``root/labels.csv``."""
    rows = ["path,label,source"]
    t = np.arange(int(seconds * SR)) / SR
    for c, label in enumerate(("high", "low", "noise")):
        for i in range(per_class):
            rng = np.random.default_rng(100 * c + i)
            if label == "noise":
                y = 0.3 * rng.standard_normal(t.size)
            else:
                freq = (150.0 if label == "low" else 2500.0) * (1 + 0.08 * i)
                y = 0.5 * np.sin(2 * np.pi * freq * t) + 0.01 * rng.standard_normal(t.size)
            rel = f"{label}/{label}_{i}.wav"
            (root / label).mkdir(parents=True, exist_ok=True)
            sf.write(root / rel, y.astype(np.float32), SR)
            rows.append(f"{rel},{label},{label}-{i}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def training_experiment(root: Path, store: Path, **overrides) -> dict:
    """An experiment with ``model`` and ``training`` sections over :func:`write_three_classes`'s folder."""
    data = {
        "name": "three",
        "seed": 0,
        "dataset": {"root": str(root), "sample_rate": SR, "segment": {"start": 0.0, "duration": 1.0}},
        "transformations": [{"name": "identity"}, {"name": "gain", "gain_db": -6.0}],
        "features": [{"name": "mel", "n_mels": 32}, {"name": "mfcc", "n_mfcc": 13}],
        "store": {"root": str(store)},
        "pipeline": [{"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 8},
                     {"name": "prefetch", "producers": 2}],
        "model": {"name": "cnn", "input": "mel", "channels": [8, 16]},
        "training": {"epochs": 4, "learning_rate": 0.01, "validation": 0.25, "threads": 1},
    }
    data.update(overrides)
    return data


def write_learner_experiment(root: Path, tmp_path: Path, epochs: int) -> tuple[dict, Path, Path]:
    """:func:`training_experiment` over ``root`` for learner processes (:data:`LEARNER_PIPELINE`, ``epochs``,
    learning rate 0.01, a quarter for validation, one torch thread; the store in ``tmp_path/store``), written to
    ``tmp_path/experiment.yml``: ``(the experiment, that file, the learners' home tmp_path/home)``."""
    data = training_experiment(root, tmp_path / "store", pipeline=LEARNER_PIPELINE,
                               training={"epochs": epochs, "learning_rate": 0.01, "validation": 0.25, "threads": 1})
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(data))
    return data, experiment, tmp_path / "home"
