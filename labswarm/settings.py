"""Runtime settings of the manager, workers and CLI (pydantic-settings, environment prefix ``LABSWARM_``).

Precedence: an explicit argument (CLI option), then the ``LABSWARM_*`` environment variable, then the default
documented here. Settings are built once at start-up (:func:`load_settings`), never read at import time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

#: Settings that hold secrets: each can be read from the file ``LABSWARM_<NAME>_FILE`` names (docker secrets).
SECRET_FIELDS = ("api_token", "metrics_token", "broker_url", "database_url")
#: The folder of a manager's home where ``labswarm compare`` runs go by default, one folder each (the dashboard
#: lists them).
COMPARE_DIR = "compare"


class Settings(BaseSettings):
    """labswarm's runtime settings.

    Attributes:
        home: folder for embedded state (SQLite database, embedded broker); ``LABSWARM_HOME``.
        database_url: SQLAlchemy URL of the manager's state; default SQLite in ``home``
            (``postgresql+psycopg://...`` for PostgreSQL).
        broker_url: Celery broker URL; default: the embedded SQLite broker in ``home``
            (``amqp://guest:guest@localhost:5672//`` for RabbitMQ). A worker reads its own (a RabbitMQ URL
            carries a password, which the manager never hands out); every secret setting (``api_token``,
            ``metrics_token``, ``broker_url``, ``database_url``) can instead be read from the file that
            ``LABSWARM_<NAME>_FILE`` names (docker secrets, :data:`SECRET_FIELDS`).
        data_roots: the directories every path that a configuration posted to the manager names must lie in
            (:mod:`labswarm.paths`); ``LABSWARM_DATA_ROOTS``, a JSON list or paths separated by ``os.pathsep``
            (``/data:/srv/audio``); empty (the default): the manager's current directory.
        api_token: the admin token (user ``admin``): every manager endpoint but ``/health`` requires
            ``Authorization: Bearer <token>`` (see :mod:`labswarm.auth.authenticator`). With no token and no
            ``tokens_file``, a manager answers only loopback clients, and ``labswarm manager`` on another address
            generates one and prints it once. Also read from the file ``LABSWARM_API_TOKEN_FILE`` names.
        tokens_file: a YAML or TOML file of named tokens (``name``, ``role`` admin|user, ``token_sha256``), hashed
            at rest; ``labswarm tokens add`` writes it.
        metrics_token: a scrape token that ``/metrics`` accepts besides the users' tokens (Prometheus).
        max_body_bytes: the largest request body the manager accepts, in bytes (1 MiB,
            :data:`labswarm.auth.limits.MAX_BODY_BYTES`); a larger one, declared or streamed, is answered 413.
        max_attempts: deliveries of one sample (broker redeliveries and republishes) before it is recorded
            as failed: a poison sample cannot loop forever.
        default_rate: publish rate of a new session in tasks/s until someone sets another.
        start_window: samples a session may have outstanding (published, no outcome yet) before anyone sets its
            rate (the health controller's first decision). It opens by one per outcome (TCP's slow start) up to
            5 s of the consume rate the publisher sees, and stays in force for the whole session when no
            controller runs. 20 by default: a few tasks for each of a few consumers, so a session cannot flood
            its queue before its workers start, and a bigger pool gets its tasks after a few task times of
            slow start (the window doubles every task time).
        report_interval: the least seconds between two outcome reports of a worker process (outcomes queued
            meanwhile go together; one queued when the last report is older leaves at once).
        samples_per_message: samples one task message carries (``LABSWARM_SAMPLES_PER_MESSAGE``); ``None``
            (unset): chosen by each session's publisher from the measured task time, tiny tasks packed up to 32
            to a message, tasks over 0.25 s alone (:mod:`labswarm.sessions.packing`); 1: always
            ``(session_id, sample)``; N > 1: ``(session_id, [sample, ...])`` with up to N. Depths and rates count
            samples; the queue bound counts samples / N (messages when unset: :mod:`labswarm.queue.app`).
        max_queue_length: hard bound on the messages waiting in each experiment queue (RabbitMQ ``x-max-length``
            with reject-publish; the publisher backs off when it is reached). ``None`` or 0: unbounded.
        celery_events: Celery's task events from workers from their start (Flower's tasks, ``celery events``);
            ``None`` (unset): off, and Flower (or ``celery control enable_events``) switches them on at run time
            through remote control (:mod:`labswarm.queue.tooling`: who reads them, the measured cost).
        celery_remote_control: workers answer ``celery inspect``/``control`` and Flower; ``None`` (unset): on with
            RabbitMQ; RabbitMQ only (the embedded broker has no broadcast).
        broker_heartbeat: the AMQP heartbeat timeout, in seconds, of the Celery apps' RabbitMQ connections (the
            manager's and each worker's: Celery's ``broker_heartbeat``, ``LABSWARM_BROKER_HEARTBEAT``; 30 s).
            Heartbeats go every half of it and a peer that missed two is taken for dead (RabbitMQ's heartbeats
            guide): a worker whose link is cut loses its connection, and its unacknowledged messages go back to
            the queue, about this long after the cut. 0 turns heartbeats off (a cut link is then found by TCP
            alone, minutes later). The publishers' own connections send none (an idle one must stay open); the
            embedded broker has none.
        queue_delete_after: seconds after the last session of an experiment ended before the manager deletes the
            experiment's queue, when it is empty and no worker consumes it (:mod:`labswarm.queue.cleanup`; a new
            session declares it again); ``None`` or 0: queues are kept.
        max_total_waiting: budget of messages waiting in all the running sessions' queues together: the health
            controller scales the sessions' target depths down so they sum to at most this. ``None`` or 0: no
            budget (each session's own target, a few seconds of its consume rate).
        reconcile_after: seconds without any outcome, with the queue empty, before a session looks for samples
            that lost their message or their report (at least 4x the slowest task seen).
        swarm_image: image of the worker services the swarm launcher creates (every node must be able to pull
            it: a registry name on a multi-node swarm).
        swarm_network: the attachable overlay network the worker services join; the manager and RabbitMQ must be
            reachable on it by service name (``docker/compose.yml`` names it ``labswarm``).
        swarm_manager_url: the manager's URL as the worker containers see it (a service name, never an IP).
        swarm_broker_url: broker URL for the worker containers; ``None``: the manager's ``broker_url``. One with a
            password reaches them as a docker secret (:mod:`labswarm.deploy.swarm_secrets`).
        swarm_concurrency: pool processes per worker container.
        swarm_data_volume: the shared data volume (datasets and feature store) mounted in each worker; an absolute
            path is bind-mounted instead (a folder every node has, e.g. an NFS mount point).
        swarm_data_target: where that volume is mounted in the containers (experiments' paths live under it).
        swarm_data_nfs: ``HOST:/export/path`` to make ``swarm_data_volume`` an NFS volume on every node it lands
            on; ``None``: a local volume (one node, or a volume driver that shares it).
        swarm_data_nfs_options: NFS mount options, ``addr=HOST`` is prepended.
        swarm_constraints: placement constraints of the worker services, e.g. ``["node.labels.labswarm==worker"]``.
        swarm_stop_grace: seconds a worker container gets to finish its running tasks when scaled down or removed.
        job_slots: learner slots of the training-jobs queue: jobs start, in fair-share order between users
            (:mod:`labswarm.jobs.lifecycle.fairshare`), while their learners fit (``LABSWARM_JOB_SLOTS``).
            ``None`` (the default): one slot per CPU core this manager may run on (``os.sched_getaffinity``);
            GPUs are counted apart, a job's ``resources.gpus`` waiting for free ones (``job_gpus``). Set it on a
            swarm, whose capacity is the cluster's, not the manager's machine.
        fair_share_half_life: seconds after which a user's past slot-time counts half in the fair-share order
            (exponential decay, as Slurm's ``PriorityDecayHalfLife``, whose default of 7 days this takes).
        user_weights: fair-share weights by user name (``{"alice": 2}``; ``LABSWARM_USER_WEIGHTS``, JSON); a
            ``weight`` in the tokens file wins; everyone else weighs 1.
        quota_running_learners: default per-user quota of learners holding slots at once (``None``: no quota); a
            job that would pass it waits in the queue, with the reason in its ``reason``. Per-user overrides:
            ``quotas`` in the tokens file (:mod:`labswarm.auth.quotas`).
        quota_gpus: default per-user quota of GPUs held by running learners at once (``None``: no quota).
        quota_queued_jobs: default per-user quota of jobs waiting in the queue; a submission over it is a 429 that
            names the quota (``None``: no quota).
        quota_active_sessions: default per-user quota of sessions running or paused at once; a start over it is a
            429 that names the quota (``None``: no quota).
        quota_workers: default per-user quota of workers the manager runs for the user's sessions at once (their
            launchers' ``workers``); a start or a scale over it is a 429 that names the quota (``None``: no quota).
        auth_failure_burst: wrong tokens one client address may present in a burst before its failures are
            answered 429 (token bucket, :mod:`labswarm.auth.failures`); valid tokens are never refused by it.
        auth_failure_rate: wrong tokens per second one client address regains (the bucket's refill).
        job_gpus: GPUs the lifecycle manager hands to learners, each learner its own ``CUDA_VISIBLE_DEVICES``;
            ``None``: those ``nvidia-smi -L`` lists (0 without it).
        job_heartbeat_timeout: seconds a running learner may go without reporting before the watchdog declares it
            hung, kills it and restarts it like a crashed one (reports come every second).
        job_start_timeout: seconds a new learner may take to send its first report (starting Python and torch).
        job_halt_grace: seconds a halted learner gets to checkpoint and exit before it is killed.
        job_launcher: how learners run (``LABSWARM_JOB_LAUNCHER``): ``local`` processes (the default) or one docker
            swarm ``service`` per learner, configured by the ``swarm_*`` settings
            (:mod:`labswarm.deploy.swarm_learners`).
        learner_cgroups: how a local learner's ``resources`` are enforced (``LABSWARM_LEARNER_CGROUPS``,
            :mod:`labswarm.deploy.cgroups`): unset (``None``, the default): by a cgroup of its own where the
            manager may create one and the learner join it, else by CPU affinity and ``RLIMIT_AS``
            (:mod:`labswarm.deploy.resource_limits`); ``true``: by a cgroup or not at all: a learner that cannot
            get or join one fails to start (``S105``) with the reason; ``false``: always by affinity and
            ``RLIMIT_AS``.
        learner_warm_start: local learners forked by one process that has imported their modules (labswarm,
            torch) instead of each starting an interpreter (``LABSWARM_LEARNER_WARM_START``,
            :mod:`labswarm.jobs.learner.warm`): ~4 s of CPU less per learner, for many short jobs; off by default.
    """

    model_config = SettingsConfigDict(env_prefix="LABSWARM_", extra="ignore")

    home: Path = Path(".labswarm")
    database_url: str | None = None
    broker_url: str | None = None
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    api_token: str | None = None
    tokens_file: Path | None = None
    metrics_token: str | None = None
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    max_attempts: int = Field(5, ge=1)
    default_rate: float = Field(200.0, gt=0)
    start_window: int = Field(20, ge=1)
    report_interval: float = Field(0.25, gt=0)
    samples_per_message: int | None = Field(None, ge=1, le=1_000)
    reconcile_after: float = Field(10.0, gt=0)
    max_queue_length: int | None = Field(10_000, ge=0)
    swarm_image: str = "labswarm:latest"
    swarm_network: str = "labswarm"
    swarm_manager_url: str = "http://manager:8000"
    swarm_broker_url: str | None = None
    swarm_concurrency: int = Field(1, ge=1)
    swarm_data_volume: str = "labswarm-data"
    swarm_data_target: str = "/data"
    swarm_data_nfs: str | None = None
    swarm_data_nfs_options: str = "rw,nfsvers=4"
    swarm_constraints: list[str] = Field(default_factory=list)
    swarm_stop_grace: float = Field(60.0, gt=0)
    max_total_waiting: int | None = Field(2_000, ge=0)
    celery_events: bool | None = None
    celery_remote_control: bool | None = None
    broker_heartbeat: float = Field(30.0, ge=0)
    queue_delete_after: float | None = Field(3600.0, ge=0)
    job_slots: int | None = Field(None, ge=1)
    fair_share_half_life: float = Field(7 * 24 * 3600.0, gt=0)
    user_weights: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    quota_running_learners: int | None = Field(None, ge=0)
    quota_gpus: int | None = Field(None, ge=0)
    quota_queued_jobs: int | None = Field(None, ge=0)
    quota_active_sessions: int | None = Field(None, ge=0)
    quota_workers: int | None = Field(None, ge=0)
    auth_failure_burst: int = Field(200, ge=1)
    auth_failure_rate: float = Field(10.0, gt=0)
    job_gpus: int | None = Field(None, ge=0)
    job_heartbeat_timeout: float = Field(60.0, gt=0)
    job_start_timeout: float = Field(300.0, gt=0)
    job_halt_grace: float = Field(30.0, gt=0)
    job_launcher: Literal["local", "swarm"] = "local"
    learner_cgroups: bool | None = None
    learner_warm_start: bool = False

    @field_validator("data_roots", mode="before")
    @classmethod
    def _data_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [p for p in text.split(os.pathsep) if p]
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        """Precedence: explicit arguments, ``LABSWARM_*`` variables, ``LABSWARM_*_FILE`` files, defaults."""
        return init_settings, env_settings, _FileSecrets(settings_cls), dotenv_settings, file_secret_settings

    def resolved_database_url(self) -> str:
        """``database_url``, or the SQLite file ``home/manager.sqlite``."""
        return self.database_url or f"sqlite:///{(self.home / 'manager.sqlite').resolve()}"

    def resolved_broker_url(self) -> str:
        """``broker_url``, or the embedded SQLite broker ``sqla+sqlite:///home/broker.sqlite``."""
        return self.broker_url or f"sqla+sqlite:///{(self.home / 'broker.sqlite').resolve()}"


class _FileSecrets(PydanticBaseSettingsSource):
    """``LABSWARM_<NAME>_FILE=/run/secrets/...``: the secret setting ``NAME`` is that file's content, stripped."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every secret field at once

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name in SECRET_FIELDS:
            variable = f"LABSWARM_{name.upper()}_FILE"
            path = os.environ.get(variable)
            if path:
                try:
                    found[name] = Path(path).read_text(encoding="utf-8").strip()
                except OSError as exc:
                    raise ValueError(f"{variable}: cannot read {path}: {exc.strerror}") from None
        return found


def load_settings(**overrides) -> Settings:
    """Settings from the environment, with explicit non-``None`` ``overrides`` taking precedence."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
