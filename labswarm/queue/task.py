"""The compute task and the per-process worker state.

A task message is ``(session_id, sample)`` with the keyword ``fingerprint``: one sample as a small JSON mapping
(no configuration, no audio) and the fingerprint of the experiment configuration its session runs; with the
manager's ``samples_per_message`` N > 1 it is ``(session_id, [sample, ...])``, up to N samples computed one after
the other, each outcome reported on its own. A multi-sample message that comes back *redelivered* (its worker
died on it) is not run: it is split into single-sample messages, published with confirms to the same queue,
then acknowledged (:func:`split`), so that from the first crash on each sample counts its own deliveries and a
poison sample fails alone after ``max_attempts`` (innocent samples are not charged for that first crash; the
poison one runs at most once more than with single-sample messages). Each worker
process builds its :class:`~labswarm.pipeline.features.FeaturesBlock` once, from the configuration the worker
fetched from the manager at start-up. The sample it computes is rebuilt from that configuration (a clip of its
dataset, a transformation by index): a message whose sample is not exactly one of the experiment's fails that
sample with the reason. A message of another fingerprint (the experiment was registered again)
makes the process fetch the configuration again; if the manager's still differs, the message belongs to a
session of an older configuration: its sample fails with that reason, never computed with the wrong one. The
task is idempotent (a sample already in the store is a no-op), so at-least-once delivery gives exactly-once
results. The arrays of a message, of one sample or several, are made durable together, one sync for the message
or a remote store's uploads in the background (:meth:`~labswarm.store.store.FeatureStore.batch`), and its outcomes
are reported after that (a single sample's two arrays of a local folder: one ``syncfs`` 4.0-4.5 ms median against
two ``fsync`` 7.3-8.0 ms, 100 pairs x 3 alternating rounds, load 3.5-6, 2026-11-26).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import DatasetError, LabswarmError, ManagerError, StoreError, StoreRefused
from labswarm.pipeline.features import FeaturesBlock, SampleResult
from labswarm.queue.names import TASK_NAME, app_queue, queue_name
from labswarm.queue.reporter import Reporter
from labswarm.sample import ExperimentSamples, ForeignSample, Sample
from labswarm.store.uploads import RETRY_DELAY, STORE_RETRIES  # one retry policy for the store's writes

#: Queue names are this prefix and the experiment's name.
QUEUE_PREFIX = queue_name("")

log = logging.getLogger(__name__)

#: Seconds during which a fingerprint found stale (the manager has another) fails its messages without asking
#: the manager again.
STALE_RECHECK = 5.0
#: Seconds a worker tries to publish the parts of a redelivered multi-sample message (queue full, broker down)
#: before it gives the message back to the queue (requeued: it is split on its next delivery).
SPLIT_TIMEOUT = 30.0


@dataclass
class WorkerState:
    """What a worker process needs: its experiments, their features blocks, and the outcome reporter.

    Built in the worker's main process before the pool forks (``configs``, ``manager_url``); blocks and the
    reporter are created lazily in each pool process (threads and open files do not survive a fork).

    Attributes:
        configs: the configuration of each experiment this worker consumes, by name.
    """

    configs: dict[str, ExperimentConfig]
    manager_url: str
    token: str | None = None
    report_interval: float = 0.25
    blocks: dict[str, FeaturesBlock] = field(default_factory=dict, repr=False)
    reporter: Reporter | None = field(default=None, repr=False)
    client: ManagerClient | None = field(default=None, repr=False)
    fingerprints: dict[str, str] = field(default_factory=dict, repr=False)
    stale: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)
    samples: dict[str, ExperimentSamples] = field(default_factory=dict, repr=False)
    splitter: Any = field(default=None, repr=False)  # (TaskMessages, publisher) of split(), made on first use

    def ensure(self) -> None:
        """Build the features blocks, the manager client and the reporter of this process once."""
        for name, config in self.configs.items():
            if name not in self.blocks:
                self.blocks[name] = FeaturesBlock(config)
                self.fingerprints[name] = config.fingerprint()
        if self.client is None:
            self.client = ManagerClient(self.manager_url, self.token)
        if self.reporter is None:
            self.reporter = Reporter(self.client, self.report_interval)

    @property
    def manager(self) -> ManagerClient:
        """The manager client of this process.

        Raises:
            RuntimeError: :meth:`ensure` has not made it.
        """
        if self.client is None:
            raise RuntimeError("the worker state has no manager client yet: call ensure() first")
        return self.client

    @property
    def outcomes(self) -> Reporter:
        """The outcome reporter of this process.

        Raises:
            RuntimeError: :meth:`ensure` has not made it (or :meth:`close` closed it).
        """
        if self.reporter is None:
            raise RuntimeError("the worker state has no outcome reporter: call ensure() first")
        return self.reporter

    def experiment_for(self, routing_key: str | None) -> str:
        """The experiment whose queue (``labswarm.<experiment>``) a message came from.

        Raises:
            RuntimeError: the message came from a queue of an experiment this worker was not started for.
        """
        if routing_key and routing_key.startswith(QUEUE_PREFIX):
            name = routing_key[len(QUEUE_PREFIX):]
            if name in self.blocks:
                return name
            raise RuntimeError(f"message for experiment {name!r}; this worker serves {sorted(self.blocks)}")
        if len(self.blocks) == 1:
            return next(iter(self.blocks))
        raise RuntimeError(f"cannot tell the experiment of a message routed as {routing_key!r}")

    def block_for(self, routing_key: str | None) -> FeaturesBlock:
        """The block of the experiment whose queue a message came from (see :meth:`experiment_for`)."""
        return self.blocks[self.experiment_for(routing_key)]

    def check(self, name: str, fingerprint: str | None) -> str | None:
        """Make sure this process computes a message of configuration ``fingerprint`` with that configuration.

        A fingerprint other than the one held makes it fetch the experiment's configuration from the manager
        again (and keep the manager's, whatever it is); a fingerprint found stale that way is not asked about
        again for :data:`STALE_RECHECK` s.

        Returns:
            ``None`` when the block of ``name`` now has that configuration (or the message carries none), else
            why the message must not be computed.

        Raises:
            ManagerError: the manager cannot be asked.
        """
        held = self.fingerprints[name]
        if fingerprint is None or fingerprint == held:
            return None
        checked = self.stale.get((name, fingerprint))
        if checked is None or time.monotonic() - checked > STALE_RECHECK:
            config = ExperimentConfig.model_validate(self.manager.experiment_config(name))
            held = config.fingerprint()
            if held != self.fingerprints[name]:
                log.info("experiment %s: configuration %s replaces %s", name, held, self.fingerprints[name])
                self.configs[name], self.blocks[name], self.fingerprints[name] = config, FeaturesBlock(config), held
                self.samples.pop(name, None)
            if held == fingerprint:
                return None
            self.stale[(name, fingerprint)] = time.monotonic()
        return (f"StaleConfiguration: the message was published for configuration {fingerprint} of experiment "
                f"{name!r}, the manager now has {held} (registered again after the session started); not computed")

    def sample_of(self, name: str, data: dict) -> Sample | str:
        """The sample of experiment ``name`` a message names, rebuilt from this process's configuration (its
        clips read once), or why the message's sample is not one of that experiment's (a path that is no clip of
        its dataset, a transformation that is not the one at that index, ...): such a sample is not computed."""
        samples = self.samples.get(name)
        if samples is None:
            samples = self.samples[name] = ExperimentSamples(self.configs[name])
        try:
            return samples.verified(data)
        except ForeignSample as exc:
            return f"ForeignSample: not a sample of experiment {name!r}: {exc}; not computed"
        except DatasetError as exc:
            return f"DatasetError: the sample cannot be checked against the dataset of experiment {name!r}: {exc}"

    def close(self) -> None:
        """Flush the outcomes not yet reported; close the splitter's broker connection."""
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None
        if self.splitter is not None:
            self.splitter[1].close()
            self.splitter = None


_state: WorkerState | None = None


def set_worker_state(state: WorkerState | None) -> None:
    """Install the state this process's tasks use (called by ``labswarm worker`` before the pool starts)."""
    global _state
    _state = state


def worker_state() -> WorkerState:
    """The state of this worker process.

    Raises:
        RuntimeError: the process is not a labswarm worker (no state installed).
    """
    if _state is None:
        raise RuntimeError("this process is not a labswarm worker: no experiment configuration installed")
    _state.ensure()
    return _state


def run_sample(block: FeaturesBlock, sample: Sample) -> SampleResult:
    """Process a sample, retrying transient store failures: :data:`~labswarm.store.uploads.STORE_RETRIES` runs in
    all, :data:`~labswarm.store.uploads.RETRY_DELAY` s before the second, doubled each time (inside a multi-sample
    message of a remote store the uploads are retried by the same policy, :mod:`labswarm.store.uploads`)."""
    delay = RETRY_DELAY
    for _ in range(STORE_RETRIES - 1):
        result = block.process(sample)
        if result.status != "failed" or not (result.reason or "").startswith("StoreError"):
            return result
        log.warning("sample %s: %s; retrying in %.1f s", sample.id, result.reason, delay)
        time.sleep(delay)
        delay *= 2
    return block.process(sample)  # the last attempt, whatever its outcome


def compute(task: Task, session_id: str, sample: dict | list, fingerprint: str | None = None) -> str:
    """The body of the ``labswarm.compute`` task: one sample (a mapping), or several (a list of mappings, computed
    in turn). Returns the outcome's status (``abandoned``: not run, the sample is out of attempts; ``unchecked``:
    not run, the manager could not confirm the configuration; ``rejected``: no sample id to record an outcome
    for); for several samples, their statuses joined by commas; ``split`` (see :func:`split`); or, for one sample or
    several, ``unstored`` (their arrays could not be made durable together, a remote store's upload failing after
    its retries: no outcome, reconciliation publishes them again; a store that refuses them for good, no bucket or
    credentials refused, :class:`~labswarm.errors.StoreRefused`: the samples computed fail with its reason). The
    sample computed is the experiment's own, rebuilt from its id (:meth:`WorkerState.sample_of`): a message that
    describes it otherwise fails it, not computed.

    Raises:
        celery.exceptions.Reject: (requeue) a redelivered multi-sample message could not be split.
    """
    state = worker_state()
    delivery = task.request.delivery_info or {}
    redelivered = bool(delivery.get("redelivered"))
    samples = sample if isinstance(sample, list) else [sample]  # a list of one: as a single-sample message
    if redelivered and len(samples) > 1:
        return split(task, state, session_id, samples, fingerprint)
    # the message's arrays made durable together (FeatureStore.batch: one sync of a local folder, a remote store's
    # uploads in the background, a sample's two arrays at once), and only then its outcomes reported: an outcome
    # never says done for an array not yet stored
    held: list[dict] = []
    statuses: list[str] = []
    store = state.blocks[state.experiment_for(delivery.get("routing_key"))].store
    try:
        with store.batch():
            statuses = [_compute_one(task, state, session_id, one, fingerprint, redelivered, held) for one in samples]
    except StoreRefused as exc:  # for good (no bucket, credentials refused): published again, they would only come
        # back until out of attempts, then fail as lost; they fail now, with the store's reason
        log.warning("message %s: the store refused its samples' arrays: %s", task.request.id, exc)
        for outcome in held:
            if outcome["status"] == "computed":
                outcome.update(status="failed", reason=f"StoreRefused: {exc}")
        statuses = ["failed" if status == "computed" else status for status in statuses]
    except StoreError as exc:  # no outcome: the arrays placed stay, reconciliation finds them and publishes the rest
        log.warning("message %s: its %d samples' arrays could not be stored: %s", task.request.id, len(samples), exc)
        return "unstored"
    state.outcomes.add_many(session_id, held)  # together: one request, as soon as the reporter may send
    return ",".join(statuses)


def split(task: Task, state: WorkerState, session_id: str, samples: list, fingerprint: str | None) -> str:
    """Publish each of ``samples`` (a redelivered multi-sample message) as its own message to the queue the
    message came from, with publisher confirms; returns ``split`` once all are confirmed (the task then acks the
    original: a crash between the two runs some samples twice, which is harmless).

    Raises:
        celery.exceptions.Reject: (requeue) not all confirmed within :data:`SPLIT_TIMEOUT` s, or the broker
            refused for good: the original goes back to the queue, nothing is lost.
    """
    from labswarm.queue.publisher import TaskMessages, make_publisher, publish_confirmed

    delivery = task.request.delivery_info or {}
    name = state.experiment_for(delivery.get("routing_key"))
    if state.splitter is None:
        state.splitter = (TaskMessages(task.app), make_publisher(task.app))
    builder, publisher = state.splitter
    parts = [s for s in samples if isinstance(s, dict) and isinstance(s.get("id"), str)]
    if len(parts) < len(samples):
        log.warning("message %s: %d of its samples have no id; dropped", task.request.id, len(samples) - len(parts))
    messages = [builder.build(session_id, part, fingerprint) for part in parts]
    stop = threading.Event()
    timer = threading.Timer(SPLIT_TIMEOUT, stop.set)
    timer.start()
    try:
        confirmed = publish_confirmed(publisher, app_queue(task.app, name), messages, stop)
    except LabswarmError as exc:
        confirmed = -1
        log.warning("message %s: cannot split it: %s", task.request.id, exc)
    finally:
        timer.cancel()
    if confirmed < len(messages):
        raise Reject(f"split of {len(samples)} samples not confirmed", requeue=True)
    log.warning("message %s of %d samples came back (its worker was lost): split into single-sample messages",
             task.request.id, len(samples))
    return "split"


def _compute_one(task: Task, state: WorkerState, session_id: str, sample: Any, fingerprint: str | None,
                 redelivered: bool, held: list[dict] | None = None) -> str:
    """Compute one sample of a message and queue its outcome for the reporter, or append it to ``held`` (the
    caller reports it later); returns its status (see :func:`compute`)."""
    report = held.append if held is not None else (lambda outcome: state.outcomes.add(session_id, outcome))
    if not isinstance(sample, dict) or not isinstance(sample.get("id"), str):
        log.warning("message %s: a sample dropped: it has no id", task.request.id)  # no sample to fail
        return "rejected"
    if redelivered:
        # the broker gave this message back after a worker was lost: count it against the sample's attempts,
        # so a sample that kills every worker is recorded as failed instead of looping forever
        try:
            if not state.manager.redelivered(session_id, sample["id"]):
                return "abandoned"
        except ManagerError as exc:
            log.warning("cannot record the redelivery of %s: %s", sample.get("id"), exc)
    name = state.experiment_for((task.request.delivery_info or {}).get("routing_key"))
    try:
        stale = state.check(name, fingerprint)
    except ManagerError as exc:  # no outcome: the session's reconciliation publishes the sample again
        log.warning("sample %s not computed: cannot check configuration %s: %s", sample.get("id"), fingerprint, exc)
        return "unchecked"
    own = state.sample_of(name, sample) if stale is None else stale
    if isinstance(own, str):
        report({"sample_id": sample["id"], "status": "failed", "reason": own, "seconds": 0.0,
                "finished_at": time.time()})
        return "failed"
    result = run_sample(state.blocks[name], own)
    report({"sample_id": result.sample_id, "status": result.status, "reason": result.reason,
            "seconds": round(result.seconds, 4), "finished_at": time.time()})
    return result.status


def register(app: Celery) -> None:
    """Register the ``labswarm.compute`` task on ``app``."""
    app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)(compute)
