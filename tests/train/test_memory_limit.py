"""A learner under a memory limit smaller than its training data (issue 24): in a real process whose address space
is limited as a local learner's is (``resources.memory_mb`` through ``RLIMIT_AS``,
:func:`labswarm.deploy.resource_limits.apply_memory_limit`), the training split's features (synthesised
long arrays under the samples' own keys, 32 MiB each, 1.7 GB, more than the whole limit) stream from the store and
every chunk of two epochs is read; with a limit below two batches, the samples fail at once with an error naming
``resources.memory_mb``. Without the limit-derived budget the learner would keep the default 1 GiB in memory and
go over its limit (``MemoryError``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import require
from three_classes import LEARNER_PIPELINE, training_experiment, write_three_classes

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.pipeline.pipeline import Pipeline

require("torch")  # skips here, fails in CI (tests/helpers.py)

from labswarm.train.distributed.data import TrainingSamples  # noqa: E402 (after the torch check)

#: Frames of each synthesised mel array (32 bins, float32): 32 MiB a sample (54 training samples: 1.7 GB).
FRAMES = 2**18
#: What the limit leaves for data over the child's address space once torch is imported, MiB: one batch of 4
#: such samples, read twice over (the step's and the one read ahead: 256 MiB), fits 384 MiB, not 64.
HEADROOM_MIB, TIGHT_MIB = 384, 64

_CHILD = r"""
import json, os, resource, sys
import torch
torch.set_num_threads(1)
from labswarm.config.experiment import parse_experiment
from labswarm.deploy.resource_limits import MEMORY_ENV, address_space_mib, apply_memory_limit
from labswarm.errors import ConfigError
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train.distributed.data import TrainingSamples

config = parse_experiment(json.loads(sys.argv[1]))
headroom, tight = int(sys.argv[2]), int(sys.argv[3])
limit = apply_memory_limit({MEMORY_ENV: str(address_space_mib() + headroom)}, threads=0)
samples = TrainingSamples(config, Pipeline(config, split="train"), "mel")
positions = samples.load()
rows = 0
for epoch in (0, 1):
    for start in range(0, len(positions), 4):
        x, y = samples.batch(epoch, range(start, min(start + 4, len(positions))))
        rows += x.shape[0]
out = {"limit": limit, "streaming": samples.streaming, "kept": samples.nbytes, "keep_bytes": samples.keep_bytes,
       "samples": len(positions), "rows": rows, "shape": list(x.shape),
       "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
resource.setrlimit(resource.RLIMIT_AS, (address_space_mib() * 2**20 + tight * 2**20, resource.RLIM_INFINITY))
try:
    TrainingSamples(config, Pipeline(config, split="train"), "mel").load()
    out["tight"] = None
except ConfigError as exc:
    out["tight"] = str(exc)
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.slow
def test_a_learner_under_a_memory_limit_below_its_data_streams_and_a_limit_below_two_batches_is_refused(
        tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=12)
    data = training_experiment(root, tmp_path / "store", pipeline=LEARNER_PIPELINE)
    config = parse_experiment(data)
    block = FeaturesBlock(config)
    rng = np.random.default_rng(0)
    row = rng.standard_normal((32, FRAMES // 64)).astype(np.float32)
    split = TrainingSamples(config, Pipeline(config, split="train"), "mel").samples
    for i, sample in enumerate(split):
        block.store.put(block.keys(sample)["mel"], np.tile(row + i, (1, 64)))  # 32 MiB each, distinct values
    total = sum(block.store.sizes().values())
    assert total >= len(split) * 32 * 2**20
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(data, default=str), str(HEADROOM_MIB),
                           str(TIGHT_MIB)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MALLOC_ARENA_MAX": "2"})  # as the local launcher sets it
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    assert total > out["limit"], (total, out)  # the data set is larger than the whole limit
    assert out["streaming"] and out["keep_bytes"] <= HEADROOM_MIB * 2**20 // 2 and out["kept"] == 0, out
    assert out["samples"] == len(split) and out["rows"] == 2 * len(split) and out["shape"][1:] == [32, 24], out
    assert out["max_rss"] < total, out
    assert out["tight"] is not None and "resources.memory_mb" in out["tight"], out
    assert "lower the batch size" in out["tight"] and "two batches of 4 samples of 32.0 MiB" in out["tight"], out

