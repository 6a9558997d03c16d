"""Samples per task message, chosen by a session's publisher from the task time it measures (issue 27, item 1).

A message costs the same whatever it carries: the broker's routing and confirm, the worker's delivery, its pool
hop and its ack, ~1-3 ms together (bare Celery drained ~1,370 no-op tasks/s on 2 workers of a 2-core machine).
For a task of a few ms that is most of the cost; for a task of a second it is nothing, and packing would only
make a worker hold more samples, a redelivery repeat more work and the health controller's steps coarser. So
the publisher packs as many samples as make about :data:`TARGET_SECONDS` of work, at most :data:`MAX_SAMPLES`:

    N = clamp(floor(TARGET_SECONDS / mean task time), 1, MAX_SAMPLES)

with the mean task time an exponentially weighted mean over the outcomes' ``seconds`` (each outcome batch
weighs :data:`SMOOTHING`), and N = 1 until the first outcomes (a task may be long); a task of more than half
:data:`TARGET_SECONDS` travels alone.

Why 0.5 s: a message's cost is not only its CPU. With one message held per worker process (late acks, prefetch
1), a worker's pool process idles from the end of one message to the delivery of the next (the ack, the broker's
delivery, the hop from the worker's main process): on a quiet 2-core machine, real features (~60 ms a sample) one
a message left the workers idle 5 % of the time (gaps of 2-3 ms median, from the ledger's finish and task times,
issue 27), and the per-message CPU of the worker's main process, RabbitMQ and the manager (~8 ms a sample under
load) was taken from the same 2 cores; 4 samples a message (0.25 s, the target until the eighth session) cut that
CPU by ~45 %, and 8 (0.5 s) beat 4 again: fixed at 8 against 4, real features, A/B pairs alternating in one
process on a loaded 2-core machine (load 11-18), the steady rate was 1.14-1.50x in each of 4 pairs and the CPU
outside the pool processes 3.4-5.3 against 5.4-8.0 ms a sample (docs/benchmarks/distributed.md, eighth session).
The measured task time is wall time, so on a loaded machine (real tasks of 200-400 ms) the same target packs
fewer samples, 1-2. Half a second of work is still little for a redelivery to repeat or a worker to hold, and a
poison sample's mates are safe whatever the size (below).

A poison sample (one that kills its worker) risks nothing of its batch mates: a multi-sample message delivered
again after its worker was lost is split by the worker into single-sample messages before anything runs
(:func:`labswarm.queue.task.split`), from which each sample counts its own deliveries; the mates computed
before the crash are found in the store.

``LABSWARM_SAMPLES_PER_MESSAGE`` set (1 to 1,000) fixes N instead (1: one sample per message, whatever the
task time). Samples published again by reconciliation travel alone.
"""

from __future__ import annotations

import math
import threading

#: Seconds of work a message carries at most when it carries more than one sample (see the module docstring).
TARGET_SECONDS = 0.5
#: The most samples one message carries when the publisher chooses.
MAX_SAMPLES = 32
#: Weight of each outcome batch's mean in the running mean task time.
SMOOTHING = 0.2


class MessagePacking:
    """How many samples the next messages carry; thread-safe (outcomes arrive on API threads).

    Args:
        fixed: a fixed number of samples per message (``LABSWARM_SAMPLES_PER_MESSAGE``); ``None``: chosen from
            the measured task time.

    Raises:
        ValueError: ``fixed`` is below 1.
    """

    def __init__(self, fixed: int | None = None) -> None:
        if fixed is not None and fixed < 1:
            raise ValueError(f"samples_per_message must be >= 1, got {fixed}")
        self.fixed = fixed
        self._mean: float | None = None  # seconds per task
        self._lock = threading.Lock()

    @property
    def task_seconds(self) -> float | None:
        """The running mean task time in s; ``None`` before any outcome."""
        return self._mean

    def observe(self, seconds: float, count: int) -> None:
        """``count`` outcomes arrived that took ``seconds`` in all (the sum of their ``seconds``)."""
        if count <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        mean = seconds / count
        with self._lock:
            self._mean = mean if self._mean is None else (1 - SMOOTHING) * self._mean + SMOOTHING * mean

    def size(self) -> int:
        """Samples the next message carries (>= 1)."""
        if self.fixed is not None:
            return self.fixed
        mean = self._mean
        if mean is None:
            return 1
        if mean <= 0:
            return MAX_SAMPLES
        return max(1, min(MAX_SAMPLES, int(TARGET_SECONDS / mean)))
