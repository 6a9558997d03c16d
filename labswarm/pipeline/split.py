"""Train / validation split by source recording.

Clips cut from one recording (or rendered from one MIDI file, or spoken by one voice in one take) are alike;
with some on each side of a split, validation accuracy measures memory, not generalization. So the split holds
out whole sources: for each class, a seeded share of its sources (at least one when the class has two or more).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Iterable

from labswarm.datasets.folder import Clip


def validation_sources(clips: Iterable[Clip], fraction: float, seed: int) -> frozenset[str]:
    """The sources held out for validation.

    Args:
        clips: the dataset's clips (label and source are used).
        fraction: share of each class's sources held out, in [0, 1). ``0`` holds out none.
        seed: seed of the choice (the experiment seed).

    Returns:
        The held-out source ids. For each class with ``n >= 2`` sources, ``max(1, round(fraction * n))`` of them
        (never all); a class with one source keeps it for training.

    Raises:
        ValueError: ``fraction`` outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    by_label: dict[str, set[str]] = defaultdict(set)
    for clip in clips:
        by_label[clip.label].add(clip.source)
    held: set[str] = set()
    if fraction == 0.0:
        return frozenset()
    for label in sorted(by_label):
        sources = sorted(by_label[label])
        if len(sources) < 2:
            continue
        text = json.dumps([seed, label])
        rng = random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big"))
        rng.shuffle(sources)
        n = min(len(sources) - 1, max(1, round(fraction * len(sources))))
        held.update(sources[:n])
    return frozenset(held)
