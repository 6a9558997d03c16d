from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import experiment_dict, write_tone

from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.datasets.folder import Clip
from labswarm.pipeline import Pipeline
from labswarm.pipeline.split import validation_sources


def _clips(sources_per_label: dict[str, int], clips_per_source: int = 3) -> list[Clip]:
    return [Clip(f"{label}/{s}_{c}.wav", f"/d/{label}/{s}_{c}.wav", label, f"{label}-s{s}")
            for label, n in sources_per_label.items() for s in range(n) for c in range(clips_per_source)]


def test_holds_out_a_share_of_each_class_s_sources() -> None:
    clips = _clips({"music": 10, "speech": 5, "noise": 2, "solo": 1})
    held = validation_sources(clips, 0.3, seed=0)
    per_label = Counter(s.split("-")[0] for s in held)
    # round(0.3 * n), at least one where a class has two sources or more, never all, none of a lone source
    assert per_label == {"music": 3, "speech": 2, "noise": 1}
    assert Counter(s.split("-")[0] for s in validation_sources(clips, 0.01, seed=0)) == {
        "music": 1, "speech": 1, "noise": 1}
    assert Counter(s.split("-")[0] for s in validation_sources(clips, 0.99, seed=0)) == {
        "music": 9, "speech": 4, "noise": 1}
    assert validation_sources(clips, 0.0, seed=0) == frozenset()


def test_is_seeded() -> None:
    clips = _clips({"music": 10, "speech": 10})
    held = validation_sources(clips, 0.3, seed=0)
    assert validation_sources(list(reversed(clips)), 0.3, seed=0) == held  # not the order of the clips
    assert validation_sources(clips, 0.3, seed=1) != held
    assert validation_sources(clips, 0.3, seed=0) == held


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"validation fraction must be in \[0, 1\)"):
        validation_sources(_clips({"a": 3}), fraction, seed=0)


@pytest.fixture
def shared_sources(tmp_path: Path) -> ExperimentConfig:
    """12 short real clips, 3 per source recording, 2 sources per label."""
    rows = ["path,label,source"]
    for i in range(12):
        label, source = ("low", "high")[i % 2], f"rec{i % 4}"
        write_tone(tmp_path / "data" / f"c{i}.wav", freq=200.0 + 30 * i, seconds=0.5, seed=i)
        rows.append(f"c{i}.wav,{label},{source}")
    (tmp_path / "data" / "labels.csv").write_text("\n".join(rows) + "\n")
    return parse_experiment(experiment_dict(tmp_path / "data", tmp_path / "store"))


def test_the_source_block_keeps_every_source_on_one_side(shared_sources: ExperimentConfig) -> None:
    blocks = [{"name": "source"}]

    def sources(split: str) -> list[tuple[str, str]]:
        pipeline = Pipeline(shared_sources, split=split, validation=0.5, blocks=blocks)
        return [(s.id, s.source) for s in pipeline.epoch(0)]

    train, validation, every = sources("train"), sources("validation"), sources("all")
    assert {s for _, s in train}.isdisjoint({s for _, s in validation})
    assert len({s for _, s in validation}) == 2  # one of the two sources of each label
    assert sorted(train + validation) == sorted(every) and len(every) == 24
