"""Measure: held-out accuracy through ``labswarm predict`` vs the trainer's own evaluation, same model, same clips.

Takes a trained model file (default: the newest ``.labswarm/models/<experiment>-*.pt``), classifies the clean
(identity) clips of its experiment's validation split (the held-out source recordings) through
:func:`labswarm.predict.predict`, and, side by side in this process, evaluates the same model as the trainer
does (the experiment's pipeline in evaluation mode, features from the store) on the same clips and on every
validation sample (all transformations: the trainer's reported ``val_accuracy``).

    .venv/bin/python bench/predict.py [MODEL.pt]

Prints both accuracies, how many clips the two disagree on, the largest probability difference, and the time
per file through predict (features computed from the audio; on a shared machine the time is noisy).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> None:
    import torch

    from labswarm.datasets.folder import read_clips
    from labswarm.pipeline.pipeline import Pipeline
    from labswarm.pipeline.split import validation_sources
    from labswarm.predict import Predictor

    model_path = Path(argv[0]) if argv else max(Path(".labswarm/models").glob("*.pt"), key=os.path.getmtime)
    predictor = Predictor(model_path)
    config = predictor.experiment
    clips = read_clips(config.dataset.root, config.dataset.labels_path)
    held = validation_sources(clips, config.training.validation, config.seed)
    clips = [c for c in clips if c.source in held]

    started = time.perf_counter()
    predictions = predictor.predict([c.path for c in clips])
    seconds = time.perf_counter() - started
    failed = [p for p in predictions if p.error]

    truth, evaluated, all_right, all_n = {}, {}, 0, 0
    paths = {c.clip_id: c.path for c in clips}
    with torch.no_grad():
        for batch in Pipeline(config, split="validation", train=False).epoch(0):
            logits = predictor.model(torch.from_numpy(batch.features[predictor.input]))
            probs = torch.softmax(logits.double(), 1).numpy()
            all_right += int((probs.argmax(1) == batch.labels).sum())
            all_n += len(batch)
            for sample_id, p, y in zip(batch.ids, probs, batch.labels, strict=True):
                clip_id, _, index = sample_id.rpartition("#")
                if index == "0":
                    evaluated[paths[clip_id]] = p
                    truth[paths[clip_id]] = predictor.classes[int(y)]
    ok = [p for p in predictions if not p.error]
    acc_predict = np.mean([p.label == truth[p.path] for p in ok])
    acc_trainer = np.mean([predictor.classes[int(np.argmax(evaluated[p]))] == truth[p] for p in evaluated])
    disagree = sum(predictor.classes[int(np.argmax(evaluated[p.path]))] != p.label for p in ok)
    gap = max(np.abs(np.array(list(p.probabilities.values())) - evaluated[p.path]).max() for p in ok)
    reported = (predictor.meta.get("metrics") or {}).get("val_accuracy")
    print(f"model {model_path} ({config.name}), {len(clips)} held-out clips, {len(failed)} failed; load "
          f"{os.getloadavg()[0]:.1f}")
    print(f"accuracy through predict (identity clips):        {acc_predict:.4f}")
    print(f"accuracy, trainer's evaluation, same clips:        {acc_trainer:.4f}  (disagreements: {disagree}, "
          f"largest probability difference {gap:.2e})")
    print(f"accuracy, trainer's evaluation, all {all_n} validation samples: {all_right / all_n:.4f}"
          f"{f' (reported in the model file: {reported:.4f})' if reported is not None else ''}")
    print(f"predict: {seconds / len(clips) * 1000:.0f} ms per file ({len(clips)} files, {seconds:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
