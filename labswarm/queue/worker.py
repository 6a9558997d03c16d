"""``labswarm worker``: a Celery worker bound to one experiment's queue.

It fetches the experiment's configuration from the manager once, takes the broker URL from its own configuration
(``LABSWARM_BROKER_URL``: a RabbitMQ URL carries a password, which the manager never hands out), imports the audio
libraries before the pool forks (so each pool process starts warm), and each pool process builds its features
block once, with one maths thread (N single-threaded processes beat N multi-threaded ones on N cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid

from celery import signals
from celery.concurrency import get_implementation
from celery.utils.log import LOG_LEVELS

from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ConfigError
from labswarm.gcpause import collector_paused
from labswarm.queue.app import app_queue, declare_queue, is_embedded, make_celery, message_bound, queue_name
from labswarm.queue.task import WorkerState, set_worker_state, worker_state
from labswarm.queue.tooling import heartbeats
from labswarm.settings import load_settings


def _process_init(**_kwargs) -> None:
    from labswarm.threads import limit_threads

    limit_threads(1)
    worker_state()  # builds the features block, client and reporter of this pool process


def _process_shutdown(exitcode: int | None = None, **_kwargs) -> None:
    """(``worker_process_shutdown``, in a pool process that ends) Send the last outcomes, then exit at once.

    billiard's pool process, once this returns, tells the worker it is ending and sleeps 1 s, for the worker's
    result handler to kill it (SIGTERM on that message); at a warm shutdown that handler has stopped, so every
    pool process slept its full second and the worker waited for it (the last second of every ``labswarm run``,
    whose end waits for its workers: issue 27). Its tasks are done and reported here; the worker joins its pool
    processes by their exit, not by that message."""
    from labswarm.queue import task

    try:
        if task._state is not None:
            task._state.close()
    finally:
        os._exit(exitcode or 0)


#: The pool class of ``-P prefork`` (Celery's ``worker_pool`` setting): :class:`labswarm.queue.pool.TaskPool`.
POOL = "labswarm.queue.pool:TaskPool"

#: The write end of a pipe the worker's event loop watches (:func:`_wake_on_shutdown`); empty until it runs.
_wake: list[int] = []


def _watch_wake(sender=None, **_kwargs) -> None:
    """(``worker_ready``: ``sender`` is the consumer) Make the consumer's event loop watch a pipe of ours, so a
    warm shutdown can wake it (see :func:`_wake_on_shutdown`); nothing where the loop has no hub (a polling
    transport: it wakes on its own every poll)."""
    hub = getattr(sender, "hub", None)
    if hub is None or _wake:
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)

    def drain() -> None:
        with contextlib.suppress(OSError):
            os.read(read, 64)

    hub.add_reader(read, drain)
    _wake.append(write)


def _wake_on_shutdown(**_kwargs) -> None:
    """(``worker_shutting_down``, from Celery's SIGTERM handler) Wake the event loop. Celery's handler only sets a
    flag that the loop reads between two polls, and an idle loop polls until its next timer: a worker told to stop
    went on waiting ~1-2 s (a py-spy dump 1 s after SIGTERM found it still polling), the last seconds of every
    ``labswarm run`` (issue 27: the run's end waits for its workers)."""
    for fd in _wake:
        with contextlib.suppress(OSError):
            os.write(fd, b"\0")


#: What this process has warmed up (:func:`warm_up`): one key a set of transformations, features and sample rate.
_warmed: set[str] = set()


def warm_up(config: ExperimentConfig) -> None:
    """Warm up the audio libraries for ``config``'s transformations and features in this process, once
    (:meth:`~labswarm.pipeline.features.FeaturesBlock.warm_up`: imports, numba's functions, FFT plans), before the
    pool forks. What it warms lives in the process's libraries, not in the block it runs (each pool process builds
    its own): a second call for the same transformations, features and sample rate does nothing. A standby worker
    (:mod:`labswarm.cli.standby`) warms up its experiment before its session starts; the worker it becomes then
    starts consuming without running the same warm-up again (~0.2 s of CPU a worker on the 2-core machine, between
    the session's start and the worker's first task: issue 27). SciPy's docstring notes are skipped in this process
    (:func:`~labswarm.audio.scipy_docs.skip_doc_notes`: ~0.3 s of the first warm-up's imports)."""
    from labswarm.audio.scipy_docs import skip_doc_notes
    from labswarm.pipeline.features import FeaturesBlock

    skip_doc_notes()  # before the warm-up's librosa imports scipy.signal
    key = json.dumps([config.dataset.sample_rate, config.model_dump(mode="json", include={"transformations",
                                                                                           "features"})],
                     sort_keys=True)
    if key in _warmed:
        return
    FeaturesBlock(config).warm_up()
    _warmed.add(key)


def _log_level(name: str) -> int:
    """Celery's log level ``name`` (any case: ``DEBUG`` to ``CRITICAL``, ``FATAL``) as a number, as its command line
    reads ``--loglevel``.

    Raises:
        ConfigError: not one of those names.
    """
    level = LOG_LEVELS.get(name.upper()) if isinstance(name, str) else None
    if not isinstance(level, int):
        raise ConfigError([("loglevel", f"{name!r} is not a log level (DEBUG, INFO, WARNING, ERROR, CRITICAL)")])
    return level


def _broker_url(manager_settings: dict) -> str:
    """The worker's own ``LABSWARM_BROKER_URL``, else the manager's broker if it has no password."""
    url = load_settings().broker_url or manager_settings.get("broker_url")
    if not url:
        shown = manager_settings.get("broker") or "a broker with a password"
        raise ConfigError([("LABSWARM_BROKER_URL", f"not set, and the manager uses {shown}: the manager does not "
                                                   "hand out its password; set LABSWARM_BROKER_URL (or "
                                                   "LABSWARM_BROKER_URL_FILE) in the worker's environment")])
    return url


def run_worker(
    experiments: str | list[str],
    manager_url: str,
    *,
    broker_url: str | None = None,
    concurrency: int = 1,
    token: str | None = None,
    loglevel: str = "WARNING",
) -> None:
    """Run a worker until it is stopped (SIGTERM: warm shutdown, finishing the running tasks).

    Args:
        experiments: the experiment (or experiments) whose queues to consume. A worker on several queues
            shares itself between their sessions; the health controller sets their shares by session weight.
        manager_url: the manager's base URL.
        broker_url: the broker; ``None``: ``LABSWARM_BROKER_URL`` (or the file ``LABSWARM_BROKER_URL_FILE``
            names), else the manager's broker when it has no password (the embedded broker).
        concurrency: pool processes.
        token: the manager's API token.
        loglevel: Celery log level.

    Raises:
        ManagerError: the manager cannot be reached or does not know an experiment.
        SystemExit: the worker stopped with a non-zero status (``worker.exitcode``: Celery's "Unrecoverable error",
            a cold shutdown), as ``celery worker`` exits with it.
        ConfigError: no broker URL is known (the manager's needs a password: the message shows it masked), or
            ``loglevel`` is not a log level.
    """
    # what the imports and the warm-up make lives as long as the process: out of the collector's sight before the
    # pool forks (collector_paused(freeze=True): Python's advice for a fork without exec, no copy-on-write of its
    # objects by collections in the pool processes), and out of the collections at exit (3-4 s of a loaded 2-core
    # machine, 0.7 s frozen); the collector is off meanwhile (~12 % of the start's CPU; `labswarm worker` turns it
    # off while importing too), on again after one collection of the garbage of that time
    level = _log_level(loglevel)  # before anything starts, as Celery's command line checked it
    with collector_paused(freeze=True):
        names = [experiments] if isinstance(experiments, str) else list(dict.fromkeys(experiments))
        client = ManagerClient(manager_url, token)
        configs = {name: ExperimentConfig.model_validate(client.experiment_config(name)) for name in names}
        settings = client.settings()
        client.close()
        label = names[0] if len(names) == 1 else f"{len(names)}-experiments"
        own = load_settings()
        app = make_celery(broker_url or _broker_url(settings),
                          message_bound(settings.get("max_queue_length"), settings.get("samples_per_message", 1)),
                          role="worker", experiment=label, events=own.celery_events,
                          remote_control=own.celery_remote_control, heartbeat=own.broker_heartbeat)
        app.conf.task_queues = [app_queue(app, name) for name in names]
        app.conf.worker_pool = POOL  # Celery's prefork pool, less the last 0.5 s of its warm stop (labswarm.queue.pool)
        if is_embedded(app.conf.broker_url):
            for name in names:
                declare_queue(app, name)  # under the broker's lock: see declare_queue
        set_worker_state(WorkerState(configs, manager_url, token, float(settings.get("report_interval", 0.25))))
        # import the heavy libraries (and warm them up) before the pool forks
        for config in configs.values():
            warm_up(config)
    signals.worker_process_init.connect(_process_init, weak=False)
    signals.worker_process_shutdown.connect(_process_shutdown, weak=False)
    signals.worker_ready.connect(_watch_wake, weak=False)
    signals.worker_shutting_down.connect(_wake_on_shutdown, weak=False)
    # unique per worker, not only per host and pid: containers on the host network (swarm services, compose) share
    # the host's name and often the same pid (7 behind docker-init), and Celery's remote-control queue
    # (<name>.celery.pidbox) is exclusive: a second worker of the same name failed to declare it (405
    # RESOURCE_LOCKED) and exited, so the queue had fewer consumers than containers (tests/docker's scale test)
    name = f"labswarm-{label}-{os.getpid()}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    # what `celery worker -Q ... -c N -P prefork -n NAME --loglevel L --without-gossip --without-mingle` builds and
    # starts (celery.bin.worker), without Celery's command line: importing it (its commands, Flower's and click-repl's
    # with prompt_toolkit: ~300 modules, 0.14 s of CPU) came after a standby worker's take, before its first task
    # (issue 27). Worker heartbeats (Flower's "online") are what lets a monitor switch task events on
    # (labswarm.queue.tooling)
    worker = app.Worker(hostname=name, pool_cls=get_implementation(POOL), loglevel=level,
                        queues=[queue_name(n) for n in names], concurrency=concurrency, without_gossip=True,
                        without_mingle=True, without_heartbeat=not heartbeats(app.conf))
    worker.start()
    if worker.exitcode:  # Celery's "Unrecoverable error" or a cold shutdown: the status its command line exits with
        raise SystemExit(worker.exitcode)  # (a supervisor restarting on failure must see it)
