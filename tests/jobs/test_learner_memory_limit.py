"""A training job's learner under ``resources.memory_mb`` smaller than its training data (issue 24), through a real
manager and the local launcher: the learner's address space is limited to ``memory_mb`` (``RLIMIT_AS``,
labswarm/deploy/resource_limits.py), its training split's features (synthesised: 32 MiB a sample under the
samples' own keys, sparse files, 1.7 GB in all, more than the limit) stream from the store and the job completes;
the same job with a batch larger than the limit leaves (16 samples of 32 MiB) fails at once with the user error
C107, whose text names ``resources.memory_mb``, and the learner's log says what to change."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import require
from train.three_classes import LEARNER_PIPELINE, write_three_classes

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.pipeline.pipeline import Pipeline

require("torch")  # skips here, fails in CI (tests/helpers.py)

from labswarm.train.distributed.data import TrainingSamples  # noqa: E402 (after the torch check)

#: Frames of each synthesised mel array (32 bins, float32): 32 MiB a sample.
FRAMES = 2**18
#: The learner's limit, MiB: its address space once started (~1 GiB: torch, gloo) leaves ~400-500 MiB, room for
#: two batches of 4 samples (256 MiB) but not for one of 16 (512 MiB); the training split takes 1.7 GB.
MEMORY_MB = 1536


def _synthesise(experiment: dict, tmp_path: Path) -> int:
    """Write each training sample's mel array (``(32, FRAMES)`` float32, a sparse file: zeros but the first frames)
    under its key in the experiment's store; returns the bytes the split's arrays take (their lengths)."""
    config = parse_experiment(experiment)
    block = FeaturesBlock(config)
    total = 0
    for i, sample in enumerate(TrainingSamples(config, Pipeline(config, split="train"), "mel").samples):
        key = block.keys(sample)["mel"]
        path = block.store.storage.local_path(block.store.relpath(key))
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(32, FRAMES))
        array[:, :256] = i  # distinct samples; the rest of the file is a hole
        array.flush()
        del array
        total += path.stat().st_size
    return total


def _logs(m, job_id: str) -> list[str]:
    return [line["line"] for line in m.http.get(f"/v1/jobs/{job_id}/logs", params={"pagesize": 5000}).json()["lines"]]


@pytest.mark.slow
def test_a_job_streams_data_larger_than_its_memory_limit_and_one_batch_over_it_fails_with_c107(
        tmp_path: Path) -> None:
    write_three_classes(tmp_path / "data", per_class=12)
    manifest = tiny_manifest(tmp_path, epochs=1, learners=2, framework={"name": "allreduce"},
                             resources={"cpus": 1, "memory_mb": MEMORY_MB})
    manifest["experiment"]["pipeline"] = LEARNER_PIPELINE
    manifest["training"]["threads"] = 1
    total = _synthesise(manifest["experiment"], tmp_path)
    assert total > MEMORY_MB * 2**20 + 2**26, total  # more than the limit with its threads' allowance
    greedy = {**manifest, "name": "greedy", "experiment": {**manifest["experiment"], "pipeline": [
        {**block, "size": 16} if block["name"] == "batch" else block for block in LEARNER_PIPELINE]},
        "framework": {"name": "allreduce", "batch": "per_learner"}}  # 16 samples a learner (global: 8 each)
    # the RLIMIT_AS path (its figures are address space); under a cgroup (resident memory) 16 samples fit 1.5 GiB
    with manager(tmp_path, job_slots=2, learner_cgroups=False) as m:
        job = m.submit(manifest)
        stream = read_events(m.http, job["id"])
        shown, lines = m.show(job["id"]), _logs(m, job["id"])
        assert statuses(stream)[-1] == "completed", (shown.get("error"), lines[-30:])
        assert any("streaming them from the store" in line for line in lines), lines[-30:]
        refused = m.submit(greedy)
        stream = read_events(m.http, refused["id"])
        shown, lines = m.show(refused["id"]), _logs(m, refused["id"])
    assert statuses(stream)[-1] == "failed", lines[-30:]
    assert shown["error_code"] == "C107" and shown["fault"] == "user", shown
    assert "resources.memory_mb" in shown["error"], shown
    assert any("two batches of 16 samples of 32.0 MiB" in line and "raise resources.memory_mb or lower the batch "
               "size" in line for line in lines), lines[-30:]
    assert len(shown["attempts"]) == 1, shown["attempts"]  # the user's fault: not restarted
