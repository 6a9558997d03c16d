"""Benchmark (issue 24, the store half in a learner's terms): a streaming learner's training steps reading the
experiment's features from the local store, from s3 through a warm cache and from s3 through a cold one.

The issue states the store's read goals in samples/s of a learner ("from the s3 store through a warm cache >= 0.95x
the local store, cold >= 0.5x"); ``bench/store_scale.py --arrays`` measures raw reads (a ``FeatureStore.get`` loop),
the stricter figure. Here, in one process, side by side in interleaved rounds:

- the experiment's computed store (``store.root``, the demo set's ``data/store``) is copied once into the s3 bucket
  under the same keys in the s3 default layout, written packs (:mod:`labswarm.store.written`): the samples in the
  order a session publishes them (:func:`labswarm.sample.iter_samples`), ``per_message`` samples a worker's message
  (each sample's arrays, every feature output), one pack and its index a message, as the workers write;
- three forms of one learner (:class:`~labswarm.train.distributed.data.TrainingSamples` with ``keep_bytes=0``:
  streamed, as a learner over the demo set's size x 10 does; its next chunk claimed and read ahead by a thread while
  the step trains, steps.py) train ``steps`` 32-sample steps of the experiment's model and optimizer (one torch
  thread, a real TCPStore cursor, as ``store_scale.py --learner``'s training steps): reading the **local** store;
  reading s3 through a **warm** cache (a cache filled by one untimed pass of the split before the rounds, the whole
  set fitting ``store.cache_bytes``' default 10 GiB); reading s3 through a **cold** cache (a fresh, empty cache
  folder and a fresh store each round: a learner's first epoch on a machine that has not trained the experiment;
  its start, the written packs listed and the split's keys found, is timed apart, before the steps);
- per form and round: samples/s, the seconds the learner waited for its input (``before_step``: the chunk's claim
  and, read ahead, the wait for its reader), this process's CPU seconds and the S3 server's (a local moto server).

A cache bounded above the data set's size (the default, 10 GiB, against the demo set's 686 MB) is cold for one
epoch only: the first epoch pulls each written pack once (a whole pack, whichever of its arrays the chunk needs;
later chunks find the rest of it cached), every later epoch reads it warm. With ``steps`` covering the epoch
(the default: every chunk of the split) the cold form is that whole first epoch; fewer steps measure its
beginning, where more of each chunk's packs are still missing (the pessimistic end).

    .venv/bin/python bench/store_scale.py --learner-s3 examples/music_speech_noise.yml [--steps N] [--rounds R]
                                          [--per-message 8]
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

#: Samples a worker's message carries by default on a quiet machine (labswarm/sessions/packing.py: ~0.5 s of
#: ~60-ms samples, 8), i.e. samples a written pack holds
PER_MESSAGE = 8
FORMS = ("local", "s3 warm cache", "s3 cold cache")


def copy_to_s3(config: Any, spec: dict, per_message: int) -> tuple[int, int, float]:
    """The experiment's computed arrays (every sample's, every feature output's) copied from its local store into
    the storage of ``spec`` in the s3 default layout (written packs), ``per_message`` samples a batch (a worker's
    message) in the order a session publishes them. Returns (arrays, packs, seconds)."""
    from labswarm.pipeline.features import FeaturesBlock
    from labswarm.sample import iter_samples
    from labswarm.store import FeatureStore

    block = FeaturesBlock(config)
    local = block.store
    remote = FeatureStore.open(Path(tempfile.gettempdir()) / "unused-learner-s3", remote=spec, cache_bytes=0)
    assert remote.packed, "the s3 default layout is written packs (LABSWARM_STORE_WRITE_PACKS unset)"
    samples = list(iter_samples(config))
    arrays = packs = 0
    started = time.perf_counter()
    for i in range(0, len(samples), per_message):
        with remote.batch():
            for sample in samples[i:i + per_message]:
                for key in block.keys(sample).values():
                    if local.contains(key):
                        remote.put(key, local.get(key))
                        arrays += 1
        packs += 1
    return arrays, packs, time.perf_counter() - started


def s3_config(config: Any, spec: dict, cache: Path) -> Any:
    """``config`` with its store on s3 (``spec``) read through a cache in the folder ``cache``."""
    data = config.model_dump(mode="json")
    data["dataset"]["root"] = str(config.dataset.root)
    data["dataset"]["labels"] = str(config.dataset.labels_path)
    data["store"] = {"root": str(cache), "remote": spec}
    return config.model_validate(data)


def streamed(config: Any) -> tuple[Any, float]:
    """A learner's training inputs on ``config``, streamed (``keep_bytes=0``), loaded; and the seconds ``load()``
    took (a remote store: its written packs listed, the split's keys found in the listing)."""
    from labswarm.pipeline.pipeline import Pipeline
    from labswarm.train.distributed.data import TrainingSamples

    samples = TrainingSamples(config, Pipeline(config, split="train"), "mel", keep_bytes=0)
    started = time.perf_counter()
    samples.load()
    assert samples.streaming
    return samples, time.perf_counter() - started


def epoch_steps(loop: Any, model: Any, optimizer: Any, steps: int, record: Path, owner: str) -> tuple[int, float,
                                                                                                      float]:
    """Up to ``steps`` training steps through the learner's :class:`CursorSteps` ``loop`` (cross-entropy; the
    pass's end when the cursor has no chunk left), then the loop closed. Returns (samples trained, wall seconds,
    seconds waited in ``before_step``: the chunk's claim and its crops, read ahead or in the step)."""
    import torch

    from labswarm.train.distributed.record import ChunkRecord

    trained, waited = 0, 0.0
    started = time.perf_counter()
    with ChunkRecord(record, owner) as loop.trained:
        for _ in range(steps):
            before = time.perf_counter()
            batch = loop.before_step(False)
            waited += time.perf_counter() - before
            if batch is None:
                break
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
            optimizer.step()
            trained += len(batch[1])
            loop.after_step()
        else:
            loop.before_step(True)
    loop.close()
    return trained, time.perf_counter() - started, waited


def warm_up(samples: Any) -> float:
    """Fill a remote store's cache with the split's arrays as a first epoch would (each chunk fetched, then read);
    the seconds it took."""
    started = time.perf_counter()
    n = len(samples.positions)
    for i in range(0, n, 32):
        samples.batch(0, list(range(i, min(n, i + 32))))
    return time.perf_counter() - started


def learner_stores(experiment: str, spec: dict, steps: int | None, rounds: int, per_message: int,
                   server_cpu: Callable[[], float | None]) -> None:
    """The benchmark of the module docstring on ``experiment`` (its store computed), the s3 bucket of ``spec``;
    ``steps`` per form and round (``None``: the whole split, an epoch), ``rounds`` interleaved rounds;
    ``server_cpu``: the S3 server's CPU seconds so far (``None`` when unknown)."""
    import torch
    from torch.distributed import TCPStore

    from labswarm.config.experiment import load_experiment
    from labswarm.train.models.base import Model, feature_bins
    from labswarm.train.optim import build_optimizer

    torch.set_num_threads(1)
    config = load_experiment(experiment)
    work = Path(tempfile.mkdtemp(prefix="learner-s3-"))
    try:
        arrays, packs, seconds = copy_to_s3(config, spec, per_message)
        print(f"copied {arrays} arrays into s3 as {packs} written packs ({per_message} samples a pack) in "
              f"{seconds:.1f} s", flush=True)
        local, start = streamed(config)
        print(f"local store: {len(local.positions)} training samples, load() {start:.2f} s", flush=True)
        warm, start = streamed(s3_config(config, spec, work / "warm"))
        print(f"s3 warm: load() {start:.2f} s, cache filled by a first pass in {warm_up(warm):.1f} s", flush=True)
        n_steps = steps or -(-len(local.positions) // 32)
        model = Model.from_spec(config.model).build(feature_bins(config, config.model.input), len(local.classes))
        optimizer = build_optimizer(torch, model.parameters(), config.training)
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        results: dict[str, list[dict[str, float]]] = {name: [] for name in FORMS}
        for r in range(rounds):
            for name in (FORMS if r % 2 == 0 else FORMS[::-1]):
                results[name].append(one_round(config, spec, work, name, local, warm, r, model, optimizer,
                                               store, n_steps, server_cpu))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]['rate']:.1f}" for n, v in results.items())
                  + f" samples/s, load {os.getloadavg()[0]:.1f}", flush=True)
        report(results, n_steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def one_round(config: Any, spec: dict, work: Path, name: str, local: Any, warm: Any, r: int, model: Any,
              optimizer: Any, store: Any, steps: int, server_cpu: Callable[[], float | None]) -> dict[str, float]:
    """One form's round (:func:`learner_stores`); its figures: rate (samples/s), wait_s, cpu_s (this process),
    server_s (the S3 server, NaN when unknown), start_s (a cold store's load(), else 0), samples."""
    import torch

    from labswarm.train.distributed.context import LearnerContext
    from labswarm.train.distributed.cursor import GlobalCursor
    from labswarm.train.distributed.steps import CursorSteps
    from labswarm.train.distributed.training import DistributedTraining

    start = 0.0
    if name == "s3 cold cache":  # a fresh, empty cache and a fresh store: a learner's first epoch on this machine
        samples, start = streamed(s3_config(config, spec, work / f"cold-{r}"))
    else:
        samples = local if name == "local" else warm
    epoch = 1000 + 10 * r + FORMS.index(name)  # a pass of its own in the cursor's store
    learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=1))
    learner.cursor = GlobalCursor(store, len(samples.positions), 32, owner=f"0:1:{epoch}")
    learner.samples = samples
    loop = CursorSteps(learner, torch, epoch, "cpu", None)
    assert loop.reader is not None, "a streaming learner reads ahead"
    cpu, server = time.process_time(), server_cpu()
    trained, seconds, waited = epoch_steps(loop, model, optimizer, steps, work / f"chunks-{epoch}.jsonl",
                                           learner.cursor.owner)
    cpu, after = time.process_time() - cpu, server_cpu()
    if name == "s3 cold cache":
        cold = samples._block._compute.store
        for reader in cold.readers:
            reader.wait()  # the cache's pack writes done before the folder goes
        if cold._fetcher is not None:  # its fetch threads, not one idle pool a round
            cold._fetcher[2].shutdown()
        shutil.rmtree(work / f"cold-{r}", ignore_errors=True)
    return {"rate": trained / seconds, "wait_s": waited, "cpu_s": cpu, "samples": trained, "start_s": start,
            "server_s": float("nan") if server is None or after is None else after - server, "seconds": seconds}


def report(results: dict[str, list[dict[str, float]]], steps: int) -> None:
    """Medians per form: samples/s and its ratio to the local store's, the input wait per step, CPU per sample."""
    def median(name: str, field: str) -> float:
        return statistics.median(v[field] for v in results[name])

    base = median("local", "rate")
    print(f"\nmedians of {len(results['local'])} rounds, {steps} steps of 32 samples a form and round:")
    for name in FORMS:
        samples = median(name, "samples")
        line = (f"  {name:14s} {median(name, 'rate'):7.1f} samples/s  {median(name, 'rate') / base:5.2f}x the local "
                f"store's; input wait {1e3 * median(name, 'wait_s') / steps:6.1f} ms a step "
                f"({100 * median(name, 'wait_s') / median(name, 'seconds'):4.1f} % of the wall), this process's CPU "
                f"{1e3 * median(name, 'cpu_s') / samples:5.2f} ms a sample")
        server = median(name, "server_s")
        if server == server:  # not NaN
            line += f", the S3 server's {1e3 * server / samples:5.2f} ms"
        if name == "s3 cold cache":
            line += f"; its start (packs listed, keys found) {median(name, 'start_s'):.2f} s before the steps"
        print(line)
    print("  per round: " + "; ".join(f"{name} " + ", ".join(f"{v['rate']:.1f}" for v in results[name])
                                      for name in FORMS))
