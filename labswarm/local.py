"""The local run: every sample of an experiment on this machine, with a process pool.

The single-machine reference the distributed run is measured against. Samples already in the store are
skipped in the parent (a stat per key); the rest go to ``jobs`` worker processes in small chunks, with a bounded
number in flight so memory stays flat on any dataset size. Each worker builds its features block once and runs
its maths libraries on one thread: on N cores, N single-threaded processes beat N multi-threaded ones (see
RUNBOOK, "Audio").
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from itertools import islice

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import StoreError
from labswarm.pipeline.features import FeaturesBlock, SampleResult
from labswarm.sample import Sample, count_samples, iter_samples
from labswarm.store.store import StoreStats
from labswarm.threads import limit_threads

#: Samples per task sent to a worker process: amortizes inter-process overhead (~0.1 ms) at ~50 ms a sample.
CHUNK = 4

_block: FeaturesBlock | None = None


@dataclass(slots=True)
class RunSummary:
    """The outcome of a run.

    Attributes:
        experiment: the experiment's name.
        total: samples in the experiment.
        computed: samples computed and written now.
        cached: samples found in the store.
        failures: ``(sample id, reason)`` of each failed sample.
        seconds: wall time of the run.
        store: store entries and bytes after the run.
    """

    experiment: str
    total: int
    computed: int = 0
    cached: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    store: StoreStats | None = None

    @property
    def failed(self) -> int:
        """Number of failed samples."""
        return len(self.failures)

    @property
    def done(self) -> int:
        """Samples with an outcome (computed + cached + failed)."""
        return self.computed + self.cached + self.failed

    def add(self, result: SampleResult) -> None:
        """Count one sample's outcome."""
        if result.status == "computed":
            self.computed += 1
        elif result.status == "cached":
            self.cached += 1
        else:
            self.failures.append((result.sample_id, result.reason or "unknown"))


def _init_worker(config_json: str) -> None:
    global _block
    limit_threads(1)
    _block = FeaturesBlock(ExperimentConfig.model_validate_json(config_json))


def _process_chunk(samples: list[dict]) -> list[SampleResult]:
    if _block is None:
        raise RuntimeError("worker process not initialised")
    return process_stored(_block, [Sample.from_dict(s) for s in samples])


def process_stored(block: FeaturesBlock, samples: list[Sample]) -> list[SampleResult]:
    """``block.process`` of each of ``samples``, their arrays made durable together before the results are
    returned (:meth:`FeatureStore.batch`, as a worker does for a message's samples: one sync of a local store; a
    remote store's uploads sent while the next sample computes). When that fails, the samples computed in the
    chunk are returned ``failed`` with the reason (a sample is never reported computed before its arrays are
    stored)."""
    results: list[SampleResult] = []
    try:
        with block.store.batch():
            for sample in samples:
                results.append(block.process(sample))
    except StoreError as exc:
        return [SampleResult(r.sample_id, "failed", f"StoreError: {exc}", r.seconds, r.keys)
                if r.status == "computed" else r for r in results]
    return results


def _chunks(items: Iterable[Sample], size: int) -> Iterator[list[Sample]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def run_local(
    config: ExperimentConfig,
    jobs: int | None = None,
    *,
    on_result: Callable[[SampleResult], None] | None = None,
) -> RunSummary:
    """Compute every sample of ``config`` into its store on this machine.

    Args:
        config: the experiment.
        jobs: worker processes; ``None`` uses every core; ``1`` runs in this process.
        on_result: called in this process with each sample's outcome, cached ones included (progress bars).

    Returns:
        The :class:`RunSummary`; failed samples carry their reasons, and a failure never stops the run.

    Raises:
        ConfigError, DatasetError, StoreError: the experiment cannot start (nothing is computed).
    """
    started = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    summary = RunSummary(config.name, count_samples(config))
    block = FeaturesBlock(config)

    def record(result: SampleResult) -> None:
        summary.add(result)
        if on_result is not None:
            on_result(result)

    def pending() -> Iterator[Sample]:
        for sample in iter_samples(config):
            if block.is_cached(sample):
                record(SampleResult(sample.id, "cached"))
            else:
                yield sample

    if jobs == 1:
        limit_threads(1)
        for chunk in _chunks(pending(), CHUNK):
            for result in process_stored(block, chunk):
                record(result)
    else:
        _in_pool(config, block, pending(), jobs, record)
    summary.seconds = time.perf_counter() - started
    summary.store = block.store.stats()
    return summary


def _in_pool(config: ExperimentConfig, block: FeaturesBlock, samples: Iterator[Sample], jobs: int,
             record: Callable[[SampleResult], None]) -> None:
    """``samples`` computed by ``jobs`` forked worker processes, in chunks, at most ``4 * jobs`` in flight."""
    block.warm_up()  # the forked workers inherit warm libraries
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                             initargs=(config.model_dump_json(),)) as pool:
        in_flight: set[Future] = set()
        for chunk in _chunks(samples, CHUNK):
            if len(in_flight) >= 4 * jobs:
                done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    for result in future.result():
                        record(result)
            in_flight.add(pool.submit(_process_chunk, [s.to_dict() for s in chunk]))
        for future in as_completed(in_flight):
            for result in future.result():
                record(result)
