"""The distributed mode's training inputs: the single-process StoreDataset's random crops, features kept in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import require
from three_classes import LEARNER_PIPELINE, training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.pipeline import Pipeline

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from labswarm.pipeline.torch_data import StoreDataset  # noqa: E402 (imports torch)
from labswarm.train.distributed.data import TrainingSamples, _cgroup_headroom  # noqa: E402


def test_a_learners_crops_are_the_single_process_crops_of_the_epoch_whatever_its_chunk(
        three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", pipeline=LEARNER_PIPELINE))
    samples = TrainingSamples(config, Pipeline(config, split="train"), "mel")
    positions = samples.load()
    reference = StoreDataset(config, "train", "mel", frames=24, random_crop=True)  # what single-process reads
    assert positions == list(range(len(reference))) == list(range(36))
    whole = StoreDataset(config, "train", "mel")[0][0]
    assert whole.shape[-1] > 24  # a real crop: clips are longer than the crop
    assert samples.nbytes == 36 * whole.numel() * 4  # full-length features, kept once
    order = np.random.default_rng(7).permutation(36).tolist()  # any chunking, any learner
    crops = {}
    for epoch in (0, 3):
        reference.set_epoch(epoch)
        for chunk in (order[:5], order[5:17], order[17:]):
            x, y = samples.batch(epoch, chunk)
            assert x.shape == (len(chunk), whole.shape[0], 24) and x.dtype == torch.float32
            for row, j in enumerate(chunk):
                rx, ry = reference[j]
                assert torch.equal(x[row], rx) and int(y[row]) == int(ry), (epoch, j)
        crops[epoch] = samples.batch(epoch, range(36))[0]
    moved = sum(not torch.equal(crops[0][i], crops[3][i]) for i in range(36))
    assert moved > 18  # re-drawn per epoch (a crop of 24 of ~44 frames lands elsewhere most of the time)
    assert samples.ids([0, 5]) == [reference.samples[0].id, reference.samples[5].id]


def test_a_cgroups_headroom_leaves_out_its_inactive_file_cache(tmp_path: Path) -> None:
    """Limit less the working set (usage less inactive file cache), for v2's and v1's file names."""
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    for folder, files in ((v2, {"memory.max": "1000", "memory.current": "800"}),
                          (v1, {"memory.limit_in_bytes": "1000", "memory.usage_in_bytes": "800"})):
        folder.mkdir()
        for name, value in files.items():
            (folder / name).write_text(value + "\n")
    assert _cgroup_headroom(str(v2)) == 200 and _cgroup_headroom(str(v1)) == 200  # no memory.stat: usage as is
    (v2 / "memory.stat").write_text("anon 400\nfile 400\nactive_file 100\ninactive_file 300\n")
    (v1 / "memory.stat").write_text("cache 400\ninactive_file 999\ntotal_inactive_file 300\n")
    assert _cgroup_headroom(str(v2)) == 500 and _cgroup_headroom(str(v1)) == 500
    assert _cgroup_headroom(None) is None and _cgroup_headroom(str(tmp_path / "none")) is None
