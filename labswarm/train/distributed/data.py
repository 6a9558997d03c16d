"""The training inputs of the trainer's distributed mode: the single-process crops, with the features in memory up
to a budget and streamed from the store beyond it.

A learner of a distributed run trains on the chunks the global cursor hands it, so a sample's input must not
depend on which learner trains it, nor on the chunk it falls in. :class:`TrainingSamples` is
:class:`~labswarm.pipeline.torch_data.StoreDataset` (``random_crop=True``: a random crop per sample, re-drawn
every epoch, positioned by (training seed, epoch, sample index)) over the training split: the crop of sample
``i`` in epoch ``e`` is ``StoreDataset(..., random_crop=True).set_epoch(e)[i]`` exactly, whichever learner takes
it (``tests/train/test_distributed_data.py``). Only where the features come from differs: each sample's
full-length features are read from the store (computed and stored if missing, as the features block does) once,
when the learner starts, and kept in memory while they fit ``keep_bytes`` (the experiment's
``training.keep_bytes``, else :func:`keep_bytes_default`, under a memory limit at most half of what the limit
leaves once the learner has started: :func:`memory_headroom`). When the split's features do not fit, the learner
**streams** them instead (issue 24): it keeps only each sample's store key and, every step, memory-maps the
chunk's arrays from the store (a local folder, or the cache of a remote store, whose missing arrays are first
fetched with parallel requests: :meth:`~labswarm.store.store.FeatureStore.fetch`) and copies out their crops, so
its memory does not grow with the data set. The learner reads the next step's chunk while the current one trains
(:mod:`labswarm.train.distributed.steps`). Whether a remote store holds a key is answered from a listing of
its shard (:mod:`labswarm.store.listing`), not a request per key.

Memory kept: the full-length features of the training split, up to ``keep_bytes``. On the demo set
(``examples/music_speech_noise.yml``: 2,124 training samples, mel ``(128, 431)`` float32) that is 469 MB per
learner, under the default budget, so the demo keeps its features as before. Reading through the store's features
block per chunk (keys derived per sample) cost 3-4.5 ms per sample per step (measured on the demo store, 2 shared
cores at load ~7, noisy); streaming derives the keys once, at start, and reads each array in place.

Under a memory limit (a local learner's ``resources.memory_mb``, its ``RLIMIT_AS``), the first sample read is
checked: two batches of samples its size (the step's and the one read ahead, each full-length array mapped while
its crop is copied), and what one thread's reads of the store hold (a remote store's packs, each held whole from
its GET until written into the cache: :meth:`~labswarm.store.store.FeatureStore.read_bytes`), must fit what the
limit leaves, or the learner stops at once with a
:class:`~labswarm.errors.ConfigError` naming ``resources.memory_mb`` instead of going over its limit mid-epoch
(``tests/train/test_memory_limit.py``: 1.7 GB of features stream under a limit of ~1.1 GiB in all); a job's
learner then exits with the over-memory code, the user error ``C107`` (``tests/jobs/test_learner_memory_limit.py``:
a 2-learner job through the manager). A cold cache is filled with as many threads as the rest of the limit holds
(:meth:`FeatureStore.fetch_threads <labswarm.store.store.FeatureStore.fetch_threads>`; up to 8 by default:
``(2 * 8 + 1)`` packs of up to 32 MiB, 544 MiB, plus 8 arrays; under ``RLIMIT_AS`` also each thread's stack, 8 MiB,
and malloc arenas, 64 MiB each: one under the launcher's ``MALLOC_ARENA_MAX=2``).
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Sequence
from typing import Any

import numpy as np

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ConfigError, SampleError
from labswarm.pipeline.blocks.batch import fit_frames
from labswarm.pipeline.blocks.features import Features, FeaturesConfig
from labswarm.pipeline.features import FeaturesBlock
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import PipelineError
from labswarm.pipeline.torch_data import StoreDataset
from labswarm.sample import Sample
from labswarm.store.store import FETCH_THREADS

log = logging.getLogger(__name__)


#: Bytes of full-length features a learner keeps in memory by default; a training split whose features take more
#: is streamed from the store (1 GiB: the demo set's 469 MB fit, the source documents' tens of GB do not).
#: The environment variable :data:`KEEP_BYTES_ENV` (bytes, an integer >= 0; 0 streams always) overrides it.
KEEP_BYTES = 2**30
KEEP_BYTES_ENV = "LABSWARM_LEARNER_KEEP_BYTES"
#: Bytes of an ``.npy`` file's header, over its array's (NumPy pads it to 64-byte multiples: 128 for a 2-D array).
NPY_HEADER = 128


def keep_bytes_default() -> int:
    """:data:`KEEP_BYTES`, or the value of :data:`KEEP_BYTES_ENV` when set.

    Raises:
        ConfigError: the variable is not an integer >= 0.
    """
    text = os.environ.get(KEEP_BYTES_ENV, "").strip()
    if not text:
        return KEEP_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError([(KEEP_BYTES_ENV, f"must be a whole number of bytes >= 0, got {text!r}")])
    return value


def memory_headroom() -> int | None:
    """Bytes this process may still map before its ``RLIMIT_AS`` soft limit (a local learner's
    ``resources.memory_mb`` plus its threads' allowance: :mod:`labswarm.deploy.resource_limits`): the limit less
    its address space now (``VmSize``); ``None`` without a limit (or where ``/proc/self/status`` is unreadable).
    A learner in a memory cgroup instead (:mod:`labswarm.deploy.cgroups`, folder in ``LABSWARM_MEMORY_CGROUP``):
    its limit less the cgroup's usage (v2 ``memory.max`` - ``memory.current``, v1 ``memory.limit_in_bytes`` -
    ``memory.usage_in_bytes``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return _cgroup_headroom(os.environ.get("LABSWARM_MEMORY_CGROUP"))
    try:
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(0, soft - used)


def _cgroup_headroom(folder: str | None) -> int | None:
    """Bytes the memory cgroup ``folder`` allows beyond its working set now; ``None`` without one (or unreadable).
    The working set is the usage less the inactive file cache (v2 ``memory.stat`` ``inactive_file``, v1
    ``total_inactive_file``), which the kernel reclaims before it would kill: as kubelet counts it (Kubernetes,
    "Node-pressure eviction", memory.available); a learner that has just read its libraries or the store would
    otherwise see its page cache as used."""
    if not folder:
        return None
    for limit, usage, inactive in (("memory.max", "memory.current", "inactive_file"),
                                   ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")):
        try:
            with open(os.path.join(folder, limit)) as a, open(os.path.join(folder, usage)) as b:
                cap, used = int(a.read()), int(b.read())
        except (OSError, ValueError):
            continue
        return max(0, cap - max(0, used - _stat(folder, inactive)))
    return None


def _stat(folder: str, key: str) -> int:
    """The value of ``key`` in the cgroup's ``memory.stat`` (bytes), 0 where absent or unreadable."""
    try:
        with open(os.path.join(folder, "memory.stat")) as stat:
            for line in stat:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


class _StoreFeatures(Features):
    """The features block with each sample's features read once and kept (full length) while ``streaming`` is
    off; once on, a sample's array is memory-mapped from the store at each read (its key derived once)."""

    def __init__(self, config: FeaturesConfig, experiment: ExperimentConfig, output: str,
                 frames: int | None) -> None:
        super().__init__(config)
        self.experiment, self.output, self.frames = experiment, output, frames
        self.kept: dict[str, dict[str, np.ndarray]] = {}
        self.kept_bytes = 0  # of the arrays in ``kept``, kept up to date (a sum over them per sample was quadratic)
        self.keys: dict[str, str] = {}  # sample id -> store key of ``output`` (streaming)
        self.streaming = False

    def index(self, sample: Sample) -> None:
        """Derive the sample's key and make sure its array is stored (computed now if missing).

        Raises:
            SampleError: it is missing and cannot (or may not) be computed.
        """
        if self._compute is None:
            self._compute = FeaturesBlock(self.experiment)
        key = self._compute.keys(sample)[self.output]
        if not self._compute.present.contains(key):  # a remote store is listed once, not asked per key
            super().load(sample)  # computes and stores it, or raises SampleError
        self.keys[sample.id] = key

    def fetch(self, ids: Sequence[str], threads: int = FETCH_THREADS) -> None:
        """Bring the arrays of samples ``ids`` into a remote store's cache with up to ``threads`` parallel requests
        (:meth:`~labswarm.store.store.FeatureStore.fetch`; nothing for a local store or cached arrays)."""
        if self._compute is not None:
            self._compute.store.fetch([self.keys[i] for i in ids if i in self.keys], threads)

    def load(self, sample: Sample) -> dict[str, np.ndarray]:
        features = self.kept.get(sample.id)
        if features is not None:
            return features
        key = self.keys.get(sample.id)
        if key is None or self._compute is None:
            features = super().load(sample)
            if not self.streaming:
                self.kept[sample.id] = features
                self.kept_bytes += sum(a.nbytes for a in features.values())
            return features
        array = self._compute.store.get(key, mmap=True)
        if self.frames is None or array.shape[-1] <= self.frames:
            array = np.array(array)  # all of it is used: read it (a memory map is read-only for torch)
        return {self.output: array}  # a crop of the memory map copies only its frames


class TrainingSamples(StoreDataset):
    """The training split of the trainer's pipeline as random crops per epoch, its features kept in memory up to
    ``keep_bytes``, streamed from the store beyond (see the module docstring).

    Args:
        experiment: the experiment.
        train: the trainer's training pipeline: its validation share, its source block's ``limit``, its features
            block's settings (``compute_missing``) and its batch block's ``frames`` (``None``: whole clips,
            each chunk padded to its longest, as the batch block pads a batch) are used.
        output: the model's input (a feature output name).
        keep_bytes: the most bytes of full-length features kept in memory (default :func:`keep_bytes_default`);
            0 streams from the start.

    Attributes:
        positions: the split's indices (into ``samples``) whose features could be read, ascending: the cursor's
            sample ``j`` is split sample ``positions[j]``. Set by :meth:`load`.

    Raises:
        ConfigError: ``output`` is not one of the experiment's feature outputs, or :data:`KEEP_BYTES_ENV` is
            invalid.
        DatasetError: the labels CSV is unreadable.
    """

    def __init__(self, experiment: ExperimentConfig, train: Pipeline, output: str, *,
                 keep_bytes: int | None = None) -> None:
        blocks = {b.name: b for b in train.blocks}
        batch = blocks.get("batch")
        super().__init__(experiment, "train", output, batch.config.frames if batch is not None else None,
                         validation=train.context.validation, random_crop=True, threads=None)
        features = blocks.get("features")
        config = features.config if features is not None else FeaturesConfig(name="features")
        self.headroom = memory_headroom()  # measured now: the model and torch are in the address space already
        self.keep_bytes = keep_bytes_default() if keep_bytes is None else keep_bytes
        if keep_bytes is None and self.headroom is not None:  # half of what the memory limit leaves
            self.keep_bytes = min(self.keep_bytes, self.headroom // 2)
        self.batch_size = batch.config.size if batch is not None else 32
        self._block: _StoreFeatures = _StoreFeatures(config.model_copy(update={"outputs": [output]}), experiment,
                                                     output, self.frames)
        source = blocks.get("source")
        limit = source.config.limit if source is not None else None
        if limit is not None:  # the source block's limit: the first samples of the split, in dataset order
            self.samples, self.labels = self.samples[:limit], self.labels[:limit]
        self.positions: list[int] = []
        #: requests at once filling a remote store's cache (fewer under a memory limit: :meth:`_check_batch`)
        self.fetch_threads = FETCH_THREADS

    def load(self) -> list[int]:
        """Read every sample's features once (computing the missing ones); a sample whose features fail
        (:class:`~labswarm.errors.SampleError`) is left out, with a warning. Streaming starts after the first
        sample when it times the split's length exceeds ``keep_bytes`` (the features are not read into memory
        first only to be dropped: that made a 10x set's learner peak at 1.3 GB), else once the kept bytes do.

        Returns:
            :attr:`positions`.

        Raises:
            PipelineError: no sample could be read.
            StoreError: the store cannot be read.
        """
        self.positions = []
        for i in range(len(self.samples)):
            try:
                if self._block.streaming:
                    self._block.index(self.samples[i])
                else:  # its full-length features read and kept (an item's crop and tensors are not needed now)
                    next(self._block(iter([self.samples[i]]), self._ctx)).features  # noqa: B018 (read for its effect)
            except SampleError as exc:
                log.warning("leaving sample %s out of the training split: %s", self.samples[i].id, exc)
                continue
            self.positions.append(i)
            if len(self.positions) == 1:
                self._check_batch(i)
            if not self._block.streaming and (self.nbytes > self.keep_bytes or (len(self.positions) == 1
                                              and self.nbytes * len(self.samples) > self.keep_bytes)):
                self._stream()
        if not self.positions:
            raise PipelineError("the training split delivered no sample: see the log for the reasons")
        return self.positions

    def _check_batch(self, i: int) -> None:
        """Under a memory limit, fail unless two batches of samples as large as sample ``i`` (the step's and the one
        read ahead, each sample's full-length array mapped while its crop is copied) and what the store's reads of
        one thread hold (:meth:`~labswarm.store.store.FeatureStore.read_bytes`: a remote store's packs, held whole
        until cached; under ``RLIMIT_AS``, the fetch thread's own address space too:
        :meth:`~labswarm.store.store.FeatureStore.read_reserve`)
        fit in what the limit left (:attr:`headroom`, measured when the samples were made); then
        :attr:`fetch_threads` fills a cold cache with as many threads as the rest allows.

        Raises:
            ConfigError: ``resources.memory_mb`` is below that.
        """
        if self.headroom is None:
            return
        assert self._block._compute is not None
        store = self._block._compute.store
        features = self._block.kept.get(self.samples[i].id)
        if features is None:  # streaming from the start: the array's size from its header (a memory map)
            features = {self.output: store.get(self._block.keys[self.samples[i].id], mmap=True)}
        size = sum(a.nbytes for a in features.values())
        batches, reads = 2 * self.batch_size * size, store.read_reserve(1, size + NPY_HEADER)
        if batches + reads > self.headroom:
            raise ConfigError([("resources.memory_mb", (
                f"leaves the learner {self.headroom / 2**20:.0f} MiB of address space once started, less than "
                f"two batches of {self.batch_size} samples of {size / 2**20:.1f} MiB "
                f"(sample {self.samples[i].id}'s full-length '{self.output}', read for a step while the one "
                f"before trains): {batches / 2**20:.0f} MiB"
                + (f", and {reads / 2**20:.0f} MiB the store's reads hold (its packs, a fetch thread)" if reads
                   else "")
                + "; raise resources.memory_mb or lower the batch size"))])
        self.fetch_threads = store.fetch_threads(self.headroom - batches, size + NPY_HEADER)

    def _stream(self) -> None:
        """Switch to streaming: forget the kept features, keep the read samples' keys."""
        log.info("the training split's features exceed %.0f MB: streaming them from the store",
                 self.keep_bytes / 1e6)
        self._block.streaming = True
        for j in self.positions:
            self._block.index(self.samples[j])
        self._block.kept.clear()
        self._block.kept_bytes = 0

    @property
    def streaming(self) -> bool:
        """Whether the features are read from the store at each step (see the module docstring)."""
        return self._block.streaming

    @property
    def nbytes(self) -> int:
        """Bytes of the features kept in memory."""
        return self._block.kept_bytes

    def ids(self, indices: Sequence[int]) -> list[str]:
        """The sample ids of cursor indices ``indices``."""
        return [self.samples[self.positions[j]].id for j in indices]

    def batch(self, epoch: int, indices: Sequence[int]) -> tuple[Any, Any]:
        """The inputs of cursor indices ``indices`` in ``epoch``: each sample's ``StoreDataset`` item of that
        epoch (its random crop), stacked.

        Returns:
            ``(x, y)``: float32 tensor ``(len(indices), n_bins, frames)`` and int64 tensor ``(len(indices),)``.
        """
        import torch

        self.set_epoch(epoch)
        if self.streaming:  # a cold cache is filled with parallel requests, not one at a time
            self._block.fetch(self.ids(indices), self.fetch_threads)
        items = [self[self.positions[j]] for j in indices]
        xs = [x for x, _ in items]
        if self.frames is None:  # whole clips: padded to the chunk's longest, as the batch block pads
            longest = max(x.shape[-1] for x in xs)
            xs = [torch.from_numpy(fit_frames(x.numpy(), longest)) for x in xs]
        return torch.stack(xs), torch.stack([y for _, y in items])
