"""What a distributed job's stored chunk record says: every training sample trained exactly once per pass.

Read from the results store (``logs/attempt-<n>/chunks-<rank>.jsonl``), never from the learners' folders: the
record must be there even for a learner killed -9 (``labswarm.train.distributed.record``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train import checkpoint
from labswarm.train.distributed import record


def train_ids(manifest: dict) -> Counter:
    """The ids of the manifest's training split, each once."""
    with Pipeline(parse_experiment(manifest["experiment"]), split="train", train=False).epoch(0) as batches:
        return Counter(i for b in batches for i in b.ids)


def assert_every_sample_once_per_pass(results: Path, shown: dict, manifest: dict, passes: int) -> None:
    """Every sample of every pass trained exactly once in the job's stored chunk record. The lines of the attempts
    before the last count where the last attempt's checkpoint (its cursor) marks their chunk done by their owner:
    the work after that checkpoint was rolled back (the attempt restarted from it) and trained again."""
    logs = results / "logs"
    attempts = shown["attempts"]
    last = attempts[-1]["number"]
    before = record.read(sorted(p for n in range(1, last) for p in logs.glob(f"attempt-{n}/chunks-*.jsonl")))
    lines = record.counted(record.read(sorted(logs.glob(f"attempt-{last}/chunks-*.jsonl"))))
    if before:
        pointer = attempts[-1]["checkpoint_in"]
        assert pointer is not None, "a new attempt from scratch: nothing before it counts"
        cursor = checkpoint.load(results / pointer["key"])["distributed"]["cursor"]
        lines += record.counted(before, cursor["passes"])
    expected = train_ids(manifest)
    for pass_ in range(passes):
        trained = Counter(i for line in lines if line["pass"] == pass_ for i in line["ids"])
        missing, twice = expected - trained, {i: n for i, n in trained.items() if n > 1}
        assert trained == expected, (f"pass {pass_}: {sum(missing.values())} of {len(expected)} samples absent from "
                                     f"the stored chunk record, {len(twice)} trained more than once")
