"""Benchmark (issue 24, the store half): the feature store on an S3 API server, read directly, through a cold
local cache and through a warm one, against the local store; writes to s3 against local writes.

Synthetic arrays of the demo set's shape (mel ``(128, 431)`` float32, ~220 KB: a 10-s clip at 22.05 kHz, hop 512)
under fresh keys; no audio is needed. Side by side in this one process, in interleaved rounds (the machine may be
shared: the load average is printed):

- writes: ``FeatureStore.put`` to a local folder (fsync on, as the workers write) and to s3;
- reads, one thread (a learner's step or one prefetch producer): local (``get``, read whole), s3 uncached (every
  read a request), s3 through the cache cold (emptied before the round: every read a request plus a local
  write) and warm (every read a local file);
- reads through a cold cache as a streaming learner reads: each 32-array chunk first fetched with 8 requests at
  once (``FeatureStore.fetch``), then memory-mapped;
- the same arrays packed (``labswarm store pack``, :mod:`labswarm.store.packs`, under a prefix of their own, packed
  once before the rounds), read through a cold cache one at a time and as a streaming learner reads (a fresh
  store each round, opened and its packs listed before the timed reads: a learner does that once, at its start;
  that time is printed apart);
- pull: ``labswarm store pull``'s path (``CachedStorage.warm``, 8 threads) into an empty cache.

    .venv/bin/python bench/store_scale.py [--arrays N] [--rounds R] [--endpoint URL]
    .venv/bin/python bench/store_scale.py --learner examples/music_speech_noise.yml [--steps N] [--rounds R]
    .venv/bin/python bench/store_scale.py --learner-s3 examples/music_speech_noise.yml [--steps N] [--rounds R]
                                          [--per-message 8]
    .venv/bin/python bench/store_scale.py --train-s3 examples/music_speech_noise.yml [--epochs 2] [--rounds R]
                                          [--keep-bytes 0]
    .venv/bin/python bench/store_scale.py --features examples/music_speech_noise.yml [--clips N] [--rounds R]
                                          [--layouts keys,packs]
    .venv/bin/python bench/store_scale.py --messages 30 [--rounds R] [--layouts keys,packs]
    .venv/bin/python bench/store_scale.py --scale examples/music_speech_noise.yml [--factor 10] [--steps N]
    .venv/bin/python bench/store_scale.py --job examples/music_speech_noise.yml [--factor 10] [--seconds S]

The second form measures a distributed learner's training inputs (labswarm/train/distributed/data.py) on a
computed store: features kept in memory against streamed from the store (memory kept, ``batch()`` samples/s),
then the learner's training steps (the experiment's model and optimizer, one learner on a real TCPStore cursor):
in memory, streamed reading each chunk in its step, streamed with the next chunk read ahead (steps.py).
``--learner-s3`` measures those training steps (streamed, read ahead) reading the local store, s3 through a warm
cache and s3 through a cold one (bench/learner_stores.py: the issue's read goals in a learner's samples/s).
``--train-s3``, the same as whole runs of ``labswarm train`` (bench/train_stores.py), samples/s from its metrics.
The third, feature computation (the local runner, 2 processes) writing to a local store against writing to s3:
real features of the demo's clips, each worker's chunk of 4 samples in one ``FeatureStore.batch`` as a worker's
message (one sync of the local store; the s3 uploads sent by background threads while the next sample computes,
all stored before the chunk's results return: labswarm/store/uploads.py), in each s3 write layout of ``--layouts``
(an object per array; the chunk's arrays as one written pack, labswarm/store/written.py). ``--messages N``
measures that write path alone: N 4-sample batches per layout and round, wall time and moto's CPU a sample.
The fourth, a learner's peak memory on the training split synthesised 1x and 10x (bench/learner_memory.py); the
fifth, each learner's peak memory in a 2-learner job through the manager on those sets (bench/job_memory.py).

The endpoint defaults to moto's server on :9000 (``bash .ci/s3``; any credentials); a bucket is made and removed.
Goals (issue 24): through a warm cache >= 0.95x the local store's reads, cold >= 0.5x; writing to s3 >= 0.9x
writing locally. moto is an in-memory Python server on this machine, not a network service: its ratios price
the request path, not a real object store's latency.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.storage.cache import CachedStorage
from labswarm.store import FeatureStore
from labswarm.store.packer import pack

SHAPE = (128, 431)  #: the demo set's mel array
DOCUMENTS_SAMPLES = 100_000 * 9  #: the source documents' workload: ~100k clips x 9 augmentations
#: Extra passes of local and warm-cache reads per round (a pass of a few hundred arrays lasts ~0.1 s: one
#: descheduling on a loaded machine would swing a single pass's rate)
LOCAL_PASSES = 10
#: Arrays a written pack holds in the --arrays reads (a worker's message: ~8 real samples, one mel each here)
WRITTEN_BATCH = 8


def server_cpu() -> float | None:
    """CPU seconds (user + system) used so far by a moto server on this machine (``moto_server`` in its command
    line, psutil), ``None`` when there is none: what each of its requests costs it."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        if any("moto_server" in part for part in process.info["cmdline"] or ()):
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                return float(times.user + times.system)
    return None


def rate(n: int, call: Callable[[], None]) -> float:
    """Arrays per second of ``call`` (which handles ``n`` arrays)."""
    started = time.perf_counter()
    call()
    return n / (time.perf_counter() - started)


def learner(experiment: str, steps: int, rounds: int) -> None:
    """A distributed learner's training inputs on ``experiment``'s store, features kept in memory against streamed
    (``TrainingSamples(keep_bytes=0)``): memory kept after ``load()`` (tracemalloc: numpy's buffers included) and
    ``batch()`` samples/s over ``steps`` random 32-sample chunks, ``rounds`` interleaved rounds."""
    import tracemalloc

    from labswarm.config.experiment import load_experiment
    from labswarm.pipeline.pipeline import Pipeline
    from labswarm.train.distributed.data import TrainingSamples

    config = load_experiment(experiment)
    variants = {}
    for name, keep in (("in memory", None), ("streamed", 0)):
        samples = TrainingSamples(config, Pipeline(config, split="train"), "mel", keep_bytes=keep)
        tracemalloc.start()
        started = time.perf_counter()
        n = len(samples.load())
        seconds = time.perf_counter() - started
        kept = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        print(f"{name}: load {seconds:.1f} s, {n} samples, {kept / 1e6:.0f} MB kept", flush=True)
        variants[name] = samples
    rng = np.random.default_rng(0)
    chunks = [rng.choice(n, 32, replace=False).tolist() for _ in range(steps)]
    rates: dict[str, list[float]] = {}
    for r in range(rounds):
        for name, samples in (variants.items() if r % 2 == 0 else reversed(variants.items())):
            rates.setdefault(name, []).append(
                rate(32 * steps, lambda s=samples, e=r: [s.batch(e, c) for c in chunks] and None))
    base = statistics.median(rates["in memory"])
    for name, values in rates.items():
        print(f"  batch() {name:10s} {statistics.median(values):7.0f} samples/s  "
              f"{statistics.median(values) / base:5.2f}x in memory")
    training_steps(config, variants, steps, rounds)


def training_steps(config: Any, variants: dict[str, Any], steps: int, rounds: int) -> None:
    """A learner's training steps (labswarm/train/distributed/steps.py: claim a chunk of the global cursor, read
    its crops, the experiment's model forward and backward with its optimizer, mark the chunk done), one learner
    on a real TCPStore, ``steps`` 32-sample steps a round: in memory, streamed reading each chunk in its step, and
    streamed with the next chunk claimed and read ahead; samples/s, ``rounds`` interleaved rounds."""
    from datetime import timedelta

    import torch
    from learner_memory import train_steps  # bench/ is the script's folder, first on sys.path
    from torch.distributed import TCPStore

    from labswarm.train.distributed.context import LearnerContext
    from labswarm.train.distributed.cursor import GlobalCursor
    from labswarm.train.distributed.steps import CursorSteps
    from labswarm.train.distributed.training import DistributedTraining
    from labswarm.train.models.base import Model, feature_bins
    from labswarm.train.optim import build_optimizer

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    classes = len(variants["in memory"].classes)
    model = Model.from_spec(config.model).build(feature_bins(config, config.model.input), classes)
    optimizer = build_optimizer(torch, model.parameters(), config.training)
    record = Path(tempfile.mkdtemp(prefix="store-scale-steps-")) / "chunks.jsonl"
    forms = {"in memory": (variants["in memory"], False), "streamed, read in the step": (variants["streamed"], False),
             "streamed, read ahead": (variants["streamed"], True)}
    rates: dict[str, list[float]] = {}
    epoch = 100
    for r in range(rounds):
        for name, (samples, ahead) in (forms.items() if r % 2 == 0 else reversed(forms.items())):
            epoch += 1
            learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=1))
            learner.cursor = GlobalCursor(store, len(samples.positions), 32, owner=f"0:1:{epoch}")
            learner.samples = samples
            loop = CursorSteps(learner, torch, epoch, "cpu", None)
            if not ahead and loop.reader is not None:
                loop.reader.close()
                loop.reader = None
            seconds = train_steps(loop, model, optimizer, steps, record, learner.cursor.owner)
            rates.setdefault(name, []).append(32 * steps / seconds)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items())
              + f" samples/s, load {os.getloadavg()[0]:.1f}", flush=True)
    base = statistics.median(rates["in memory"])
    for name, values in rates.items():
        print(f"  training steps, {name:27s} {statistics.median(values):6.1f} samples/s  "
              f"{statistics.median(values) / base:5.2f}x in memory")


def features(experiment: str, clips: int, rounds: int, spec: dict, layouts: list[str]) -> None:
    """Feature computation (labswarm's local runner, 2 worker processes) of ``experiment``'s first ``clips``
    clips (all its transformations) into a fresh local store and into a fresh prefix of the s3 bucket of ``spec``
    for each write layout of ``layouts`` (``keys``: an object per array; ``packs``: a message's arrays as one
    written pack, labswarm/store/written.py; chosen through ``LABSWARM_STORE_WRITE_PACKS``, which the workers
    inherit), ``rounds`` interleaved rounds after an untimed one (the first run of a process pays the libraries'
    one-time loading: 4-6 samples/s against 10-15 after, 2026-11-26, load ~6, always the local store's in the first
    round); samples/s, and the S3 server's CPU per sample (a local moto server only)."""
    import yaml

    from labswarm.config.experiment import load_experiment
    from labswarm.local import run_local

    config = load_experiment(experiment)
    work = Path(tempfile.mkdtemp(prefix="store-scale-features-"))
    try:
        lines = config.dataset.labels_path.read_text().splitlines()
        labels = work / "labels.csv"
        labels.write_text("\n".join(lines[:clips + 1]) + "\n")
        data = yaml.safe_load(Path(experiment).read_text())
        rates: dict[str, list[float]] = {}
        server: dict[str, list[float]] = {}
        names = ["local", *(f"s3-{layout}" for layout in layouts)]
        for r in range(-1, rounds):  # -1: the untimed round
            for name in (names if r % 2 == 0 else names[::-1]):
                store: dict = {"root": str(work / f"store-{r}-{name}")}
                if name != "local":
                    store["remote"] = {**spec, "prefix": f"features-{r}-{name}"}
                    os.environ["LABSWARM_STORE_WRITE_PACKS"] = "1" if name == "s3-packs" else "0"
                dataset = {**data["dataset"], "root": str(config.dataset.root), "labels": str(labels)}
                round_config = config.model_validate({**config.model_dump(mode="json"), "dataset": dataset,
                                                      "store": store})
                before = server_cpu()
                summary = run_local(round_config, jobs=2)
                after = server_cpu()
                assert summary.failed == 0 and summary.computed == summary.total, summary
                if before is not None and after is not None and name != "local":
                    server.setdefault(name, []).append((after - before) / summary.total * 1e3)
                if r < 0:
                    print(f"untimed round: {name} {summary.total / summary.seconds:.1f} samples/s", flush=True)
                    continue
                rates.setdefault(name, []).append(summary.total / summary.seconds)
                print(f"round {r + 1}: {name} {rates[name][-1]:.1f} samples/s, load {os.getloadavg()[0]:.1f}",
                      flush=True)
        base = statistics.median(rates["local"])
        for name, values in rates.items():
            cpu = f", server CPU {statistics.median(server[name]):.2f} ms a sample" if server.get(name) else ""
            print(f"  features into {name:9s} {statistics.median(values):6.1f} samples/s  "
                  f"{statistics.median(values) / base:5.2f}x local{cpu}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def message_writes(spec: dict, messages: int, rounds: int, layouts: list[str]) -> None:
    """The s3 write path alone: ``messages`` batches of 4 samples each (a worker's message: per sample a mel array
    ``(128, 431)`` and an MFCC-sized one ``(20, 431)``, float32, 220 + 34 kB) written in each layout of ``layouts``
    (``keys``: an object per array; ``packs``: one written pack a batch), alternating, ``rounds`` rounds; per sample
    the wall time and the moto server's CPU (a local server only; other clients of it count too)."""
    rng = np.random.default_rng(0)
    mel = rng.standard_normal(SHAPE).astype(np.float32)
    mfcc = rng.standard_normal((20, SHAPE[1])).astype(np.float32)
    for r in range(rounds):
        for layout in (layouts if r % 2 == 0 else layouts[::-1]):
            store = FeatureStore.open("/nonexistent-unused", remote={**spec, "prefix": f"messages-{r}-{layout}"},
                                      cache_bytes=0, packed=layout == "packs")
            before, started = server_cpu(), time.perf_counter()
            for _ in range(messages):
                with store.batch():
                    for _sample in range(4):
                        store.put(uuid.uuid4().hex + "0" * 8, mel)
                        store.put(uuid.uuid4().hex + "0" * 8, mfcc)
            wall, after = time.perf_counter() - started, server_cpu()
            cpu = "" if before is None or after is None else \
                f", server CPU {(after - before) / messages / 4 * 1e3:.2f} ms"
            print(f"round {r + 1}: {layout:5s} wall {wall / messages / 4 * 1e3:.2f} ms a sample{cpu}, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrays", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--endpoint", default="http://127.0.0.1:9000")
    parser.add_argument("--learner", metavar="EXPERIMENT", help="measure a learner's inputs on this experiment "
                        "(its store computed) instead of the store")
    parser.add_argument("--steps", type=int, default=None, help="32-sample chunks per round (--learner: 30; "
                        "--learner-s3: the whole split, an epoch; --scale: 4)")
    parser.add_argument("--learner-s3", metavar="EXPERIMENT", help="measure a streaming learner's training steps "
                        "reading this experiment's store locally and from s3 through a warm and a cold cache")
    parser.add_argument("--per-message", type=int, default=8, help="samples a written pack holds (--learner-s3, "
                        "--train-s3)")
    parser.add_argument("--train-s3", metavar="EXPERIMENT", help="run labswarm train on this experiment with its "
                        "store local and on s3 through a warm and a cold cache")
    parser.add_argument("--epochs", type=int, default=2, help="training.epochs of each run (--train-s3)")
    parser.add_argument("--features", metavar="EXPERIMENT", help="measure feature computation into the local "
                        "store and into s3 on this experiment's first --clips clips instead")
    parser.add_argument("--clips", type=int, default=20)
    parser.add_argument("--messages", type=int, default=0, help="measure the s3 write path alone: this many "
                        "4-sample batches per layout and round (--layouts)")
    parser.add_argument("--layouts", default="keys,packs", help="the s3 write layouts measured (--features): keys "
                        "(an object per array), packs (a message's arrays as one written pack), comma-separated")
    parser.add_argument("--scale", metavar="EXPERIMENT", help="measure a learner's peak memory on this "
                        "experiment's training split synthesised 1x and --factor x (bench/learner_memory.py)")
    parser.add_argument("--factor", type=int, default=10)
    parser.add_argument("--job", metavar="EXPERIMENT", help="measure each learner's peak memory in a 2-learner job "
                        "through the manager on this experiment's training split 1x and --factor x "
                        "(bench/job_memory.py)")
    parser.add_argument("--seconds", type=float, default=150.0, help="how long each job is watched (--job)")
    parser.add_argument("--keep-bytes", type=int, default=None, help="training.keep_bytes (--job, --train-s3)")
    args = parser.parse_args()
    if args.job:
        from job_memory import job_scale  # bench/ is the script's folder, first on sys.path

        job_scale(args.job, args.factor, args.seconds, args.keep_bytes)
        return
    if args.scale:
        from learner_memory import scale  # bench/ is the script's folder, first on sys.path

        scale(args.scale, args.factor, args.steps or 4)
        return
    if args.learner:
        learner(args.learner, args.steps or 30, args.rounds)
        return
    import boto3

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1")
    bucket = f"labswarm-bench-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    spec = {"name": "s3", "endpoint": args.endpoint, "bucket": bucket, "prefix": "features"}
    work = Path(tempfile.mkdtemp(prefix="store-scale-"))
    rng = np.random.default_rng(0)
    arrays = {uuid.uuid4().hex + "0" * 8: rng.standard_normal(SHAPE).astype(np.float32) for _ in range(args.arrays)}
    keys = sorted(arrays)
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # the S3 server's CPU seconds per array (a local moto server only)
    starts: dict[str, list[float]] = {}  # seconds to open a packed store and list its packs, before its reads
    try:
        if args.messages:
            message_writes(spec, args.messages, args.rounds, args.layouts.split(","))
            return
        if args.learner_s3:
            from learner_stores import learner_stores  # bench/ is the script's folder, first on sys.path

            learner_stores(args.learner_s3, spec, args.steps, args.rounds, args.per_message, server_cpu)
            return
        if args.train_s3:
            from train_stores import train_stores  # bench/ is the script's folder, first on sys.path

            train_stores(args.train_s3, spec, args.epochs, args.rounds, args.keep_bytes, args.per_message, server_cpu)
            return
        if args.features:
            features(args.features, args.clips, args.rounds, spec, args.layouts.split(","))
            return
        # the reads below compare one object per array (and `labswarm store pack`'s packs made from them) with the
        # local store: their stores write per key whatever LABSWARM_STORE_WRITE_PACKS says (written packs: --features)
        local = FeatureStore(work / "local")
        direct = FeatureStore.open(work / "unused", remote=spec, cache_bytes=0, packed=False)
        cached = FeatureStore.open(work / "cache", remote=spec, cache_bytes=4 * 2**30, packed=False)
        wide = FeatureStore.open(work / "cache", remote=spec, cache_bytes=4 * 2**30, packed=False)
        cache = cached.storage
        assert isinstance(cache, CachedStorage)
        packed_spec = {**spec, "prefix": "packed"}
        packed_writer = FeatureStore.open(work / "unused", remote=packed_spec, cache_bytes=0, packed=False)
        for k in keys:
            packed_writer.put(k, arrays[k])
        print(f"packed: {pack(packed_writer, keys)}", flush=True)
        written_spec = {**spec, "prefix": "written"}  # the s3 default since the eighth session: written packs
        written_writer = FeatureStore.open(work / "unused", remote=written_spec, cache_bytes=0, packed=True)
        for i in range(0, len(keys), WRITTEN_BATCH):  # a worker's messages: one written pack and its index each
            with written_writer.batch():
                for k in keys[i:i + WRITTEN_BATCH]:
                    written_writer.put(k, arrays[k])

        def writes(store: FeatureStore) -> Callable[[], None]:
            return lambda: [store.put(k, arrays[k]) for k in keys] and None

        def reads(store: FeatureStore) -> Callable[[], None]:
            return lambda: [float(store.get(k)[0, 0]) for k in keys] and None

        def mapped_reads(store: FeatureStore) -> Callable[[], None]:  # as chunked_cold_reads reads, once fetched
            return lambda: [float(store.get(k, mmap=True)[0, 0]) for k in keys] and None

        def empty_cache() -> None:
            shutil.rmtree(work / "cache" / "objects", ignore_errors=True)
            (work / "cache" / ".usage.json").unlink(missing_ok=True)

        def chunked_cold_reads(store: FeatureStore, threads: int) -> Callable[[], None]:
            def run() -> None:  # a streaming learner's path: a chunk fetched `threads` at once, then read
                for i in range(0, len(keys), 32):
                    chunk = keys[i:i + 32]
                    store.fetch(chunk, threads)
                    for k in chunk:
                        float(store.get(k, mmap=True)[0, 0])
            return run

        def pull() -> None:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda k: cache.warm(cached.relpath(k)), keys))

        for r in range(args.rounds):
            for name, call in (("write local", writes(local)), ("write s3", writes(direct))):
                rates.setdefault(name, []).append(rate(len(keys), call))
            empty_cache()
            for name, call in (("read local", reads(local)), ("read s3 uncached", reads(direct)),
                               ("read s3 cache cold", reads(cached)), ("read s3 cache warm", reads(cached))):
                rates.setdefault(name, []).append(rate(len(keys), call))
            for _ in range(LOCAL_PASSES):  # local and warm reads take ~0.1 s a pass: more passes, alternated
                for name, call in (("read local", reads(local)), ("read s3 cache warm", reads(cached))):
                    rates[name].append(rate(len(keys), call))
            for name, store, threads in (("read s3 cold, fetch 32x8", cached, 8),
                                         ("read s3 cold, fetch 32x32", wide, 32)):
                empty_cache()
                before = server_cpu()
                rates.setdefault(name, []).append(rate(len(keys), chunked_cold_reads(store, threads)))
                if before is not None and (after := server_cpu()) is not None:
                    cpu.setdefault(name, []).append((after - before) / len(keys))
            for name, chunked in (("read s3 packed, cache cold", False), ("read s3 packed cold, fetch 32x8", True)):
                shutil.rmtree(work / "pcache", ignore_errors=True)
                started = time.perf_counter()
                store = FeatureStore.open(work / "pcache", remote=packed_spec, cache_bytes=4 * 2**30)
                assert store.packs is not None
                store.packs.catalogue()  # a learner's start: the store opened, its packs listed (once a process)
                starts.setdefault(name, []).append(time.perf_counter() - started)
                for _ in range(2):  # the local store's reads beside it (one pass costs ~0.1 s), whole and mapped
                    rates["read local"].append(rate(len(keys), reads(local)))
                    rates.setdefault("read local, mapped", []).append(rate(len(keys), mapped_reads(local)))
                before = server_cpu()
                call = chunked_cold_reads(store, 8) if chunked else reads(store)
                rates.setdefault(name, []).append(rate(len(keys), call))
                if before is not None and (after := server_cpu()) is not None:
                    cpu.setdefault(name, []).append((after - before) / len(keys))
                assert store.packs.fetched > 0, "the packs were not read"
                store.packs.wait()
            shutil.rmtree(work / "wcache", ignore_errors=True)  # written packs through a fresh cache, then warm
            written = FeatureStore.open(work / "wcache", remote=written_spec, cache_bytes=4 * 2**30)
            assert written.written is not None
            started = time.perf_counter()
            written.written.catalogue()  # a learner's start: the written packs listed (once a process)
            starts.setdefault("read s3 written packs, cache cold", []).append(time.perf_counter() - started)
            before = server_cpu()
            rates.setdefault("read s3 written packs, cache cold", []).append(rate(len(keys), reads(written)))
            if before is not None and (after := server_cpu()) is not None:
                cpu.setdefault("read s3 written packs, cache cold", []).append((after - before) / len(keys))
            for _ in range(LOCAL_PASSES):
                for name, call in (("read local", reads(local)), ("read s3 written packs, cache warm", reads(written))):
                    rates.setdefault(name, []).append(rate(len(keys), call))
            empty_cache()
            rates.setdefault("pull (8 threads)", []).append(rate(len(keys), pull))
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
        per_array = local.sizes()[keys[0]]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", ()):
                client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{args.arrays} arrays {SHAPE} float32 ({per_array:,} bytes each), {args.rounds} rounds, medians:")
    for name, value in median.items():
        mapped = "fetch" in name or "mapped" in name  # memory-mapped, one value read: against the same local reads
        base = median["write local" if name.startswith("write") else "read local, mapped" if mapped else "read local"]
        print(f"  {name:32s} {value:8.0f} arrays/s  {value / base:5.2f}x the local store's"
              + (" (mapped)" if mapped else ""))
    for name, values in cpu.items():
        print(f"  {name}: the moto server's CPU {1000 * statistics.median(values):.1f} ms per array (median); "
              f"a local read's whole time {1000 / median['read local']:.2f} ms")
    for name, values in starts.items():
        print(f"  {name}: the store opened and its packs listed in {statistics.median(values):.2f} s before the "
              "timed reads (once a process)")
    total = per_array * DOCUMENTS_SAMPLES
    hours = DOCUMENTS_SAMPLES / median["pull (8 threads)"] / 3600
    print(f"\nbytes per sample (one mel array): {per_array:,}; the documents' workload ({DOCUMENTS_SAMPLES:,} "
          f"samples): {total / 1e9:,.0f} GB, pulled at this rate in {hours:.1f} h")


if __name__ == "__main__":
    main()
