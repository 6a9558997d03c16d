"""The manager's success answers as pydantic models (issue 28): what the routes send, declared in the OpenAPI schema
(:mod:`labswarm.manager.schema`) so that a generated client has typed results.

The routes keep building their JSON themselves (``dict``\\ s from the services): these models describe it, they
do not produce it, so declaring them changes no byte the server sends. ``tests/manager/test_response_models.py``
checks real answers against them. Objects are closed (``additionalProperties: false``): a field added to an answer
must be added here, or that test fails; the open ones are those whose content is the user's (an experiment's
configuration, a manifest, a metrics record's extra figures, a learner's progress).

Times: the jobs' are RFC 3339 (``format: date-time``, with ``+00:00``); the sessions' and experiments' are ISO 8601
in UTC *without* an offset (``2026-11-26T03:00:00.123456``: not RFC 3339, so declared as a string with its
pattern, :data:`UtcTime`). Rates are in tasks/s (``rate``) or samples/s (``samples_per_s``), durations in s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from labswarm.manager.quotas import QuotaList, UserPolicy

#: A session's status (:class:`labswarm.sessions.states.SessionState`'s values).
SessionStatus = Literal["running", "paused", "completed", "cancelled", "failed"]
#: A job's status (:class:`labswarm.jobs.spec.states.JobState`'s values).
JobStatus = Literal["queued", "pending", "running", "halting", "halted", "storing", "completed", "failed"]

#: A time of the sessions' and experiments' answers: ISO 8601, UTC, no offset (their database's naive value).
UtcTime = Annotated[str, Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?$",
                               description="ISO 8601 in UTC, without an offset (one where the database keeps it)")]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Health(_Closed):
    """``GET /health``: the manager answers."""

    status: Literal["ok"]


class WorkerSettings(_Closed):
    """``GET /settings``: what a worker needs besides its experiment."""

    broker_url: str | None = Field(description="the broker's URL when it carries no password (the embedded "
                                               "broker), else null: workers use their own LABSWARM_BROKER_URL")
    broker: str = Field(description="the broker's URL, its password masked")
    report_interval: float = Field(description="seconds between two outcome reports of a worker")
    max_queue_length: int | None = Field(description="the bound of a queue in samples; null: unbounded")
    samples_per_message: int = Field(description="the fixed samples per message the queue bound is computed with; 1 "
                                     "when unset (each session's publisher then packs 1 to 32 by task time)")


class Experiment(_Closed):
    """A registered experiment."""

    name: str
    owner: str
    fingerprint: str = Field(description="hash of the feature-relevant configuration")
    queue: str = Field(description="its RabbitMQ queue, labswarm.<name>")
    created_at: UtcTime
    updated_at: UtcTime
    valid: bool = Field(description="false when the stored configuration no longer validates")
    problem: str | None = Field(description="why it is not valid")


class ExperimentDetail(Experiment):
    """A registered experiment with its stored configuration."""

    config: dict[str, Any] = Field(description="the configuration, as registered (docs/guides/experiment.md)")


class SessionProgress(_Closed):
    """A session's progress: counts of samples per status, rate, times."""

    id: str
    experiment: str
    status: SessionStatus
    phase: str | None = Field(description="its publisher's phase here (publish, reconcile, follow); null when none "
                                          "runs")
    total: int = Field(description="samples of the session")
    published: int = Field(description="samples published (first time)")
    republished: int = Field(description="samples published again (no outcome after the queue drained)")
    done: int = Field(description="samples computed")
    cached: int = Field(description="samples found in the store")
    failed: int = Field(description="samples failed")
    pending: int = Field(description="samples published and waiting for an outcome")
    finished: int = Field(description="done + cached + failed")
    rate: float = Field(description="publish rate, tasks/s")
    weight: float = Field(description="share of shared workers, relative to other sessions'")
    samples_per_s: float = Field(description="samples done per second since the start")
    created_at: UtcTime
    started_at: UtcTime | None
    finished_at: UtcTime | None
    elapsed_s: float
    error: str | None
    queue: str
    launcher: str = Field(description="who runs its workers: none, local, swarm")
    owner: str
    follow: bool = Field(False, description="whether it follows its labels CSV: rows appended are published as "
                         "they appear, total grows, it ends only when cancelled")
    workers: int | None = Field(None, description="only in PUT /sessions/{id}/workers's answer: the workers asked")


class Failure(_Closed):
    """A failed sample."""

    sample_id: str
    reason: str | None
    attempts: int


class Rejected(_Closed):
    """An outcome not recorded, and why."""

    sample_id: str
    reason: str


class OutcomesAnswer(_Closed):
    """What became of a batch of outcomes."""

    applied: int
    rejected: list[Rejected]


class RedeliveryAnswer(_Closed):
    """Whether to run a redelivered sample."""

    run: bool


class Restarts(_Closed):
    """Restarts of a job, by whose fault."""

    user: int
    platform: int


class JobSummary(_Closed):
    """A job as listed."""

    id: str
    name: str
    status: JobStatus
    reason: str | None
    error_code: str | None = Field(description="docs/guides/jobs.md's error codes")
    owner: str
    error: str | None = Field(description="the error code's short text")
    fault: Literal["user", "platform"] | None
    experiment: str
    priority: int
    learners: int
    attempt: int = Field(description="the current attempt's number, 0 before the first")
    restarts: Restarts
    checkpoint: dict[str, Any] | None = Field(description="the last checkpoint's pointer")
    timestamps: dict[str, str] = Field(description="when the job last entered each status (ISO 8601)")
    submitted_at: datetime
    updated_at: datetime
    queue_position: int | None = Field(description="1 for the next queued job to start; null when not queued")


class Learner(_Closed):
    """Where one learner of an attempt ran."""

    rank: int
    host: str
    pid: int | None
    gpus: str | None
    exit_code: int | None
    killed: str | None = Field(description="why the manager killed it, if it did")
    workdir: str


class Attempt(_Closed):
    """One attempt of a job."""

    number: int
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    error_code: str | None
    reason: str | None
    checkpoint_in: dict[str, Any] | None
    checkpoint_out: dict[str, Any] | None
    learners: list[Learner]
    learner_restarts: list[dict[str, Any]] = Field(description="learners restarted alone within the attempt")


class Job(JobSummary):
    """One job, everything about it."""

    manifest: dict[str, Any] = Field(description="the manifest as submitted")
    attempts: list[Attempt]
    progress: dict[str, dict[str, Any]] = Field(description="each learner's (by rank) last progress: epoch, "
                                                            "step, loss, samples/s...")
    log_tail: list[str] | None = Field(None, description="a failed job's last log lines")
    reused: bool | None = Field(None, description="only in POST /v1/jobs's answer: true when ?reuse=true found a "
                                                  "completed identical job (answered 200, nothing queued)")


class JobPage(_Closed):
    """A page of jobs, newest first."""

    jobs: list[JobSummary]
    total: int
    offset: int
    limit: int


class Attempts(_Closed):
    """A job's attempts, first first."""

    attempts: list[Attempt]


class LogLine(_Closed):
    """One line a learner wrote."""

    seq: int = Field(description="the job's event number")
    time: datetime
    attempt: int
    rank: int | None
    line: str


class LogPage(_Closed):
    """A page of log lines; ``next_pos`` as ``pos`` continues."""

    lines: list[LogLine]
    next_pos: int


class MetricsRecord(_Open):
    """One epoch's metrics record (:meth:`labswarm.train.trainer.Trainer`); more figures may come (validation
    per class, confusion matrix, communication)."""

    epoch: int
    attempt: int
    epochs: int | None = None
    samples: int | None = None
    train_loss: float | None = Field(None, description="mean cross-entropy, nats")
    train_accuracy: float | None = None
    val_loss: float | None = Field(None, description="mean cross-entropy, nats")
    val_accuracy: float | None = None
    samples_per_s: float | None = None
    epoch_s: float | None = Field(None, description="seconds of the epoch")


class JobMetrics(_Closed):
    """A job's metrics records, each epoch once, in the order reported."""

    metrics: list[MetricsRecord]


class ValidManifest(_Closed):
    """A manifest that validates, resolved (defaults filled in)."""

    valid: Literal[True]
    manifest: dict[str, Any]


class ReportAnswer(_Closed):
    """What the manager took of a learner's report."""

    received: int = Field(description="the last event number stored")
    halt: bool = Field(description="the learner must checkpoint and stop")


#: The typed 200/201 answer of each operation (by operation id); a list type is a JSON array of the model.
RESPONSES: dict[str, Any] = {
    "health": Health, "worker_settings": WorkerSettings,
    "post_experiment": Experiment, "list_experiments": list[Experiment], "get_experiment": ExperimentDetail,
    "start_session": SessionProgress, "list_sessions": list[SessionProgress], "get_session": SessionProgress,
    "put_rate": SessionProgress, "put_weight": SessionProgress, "put_workers": SessionProgress,
    "pause": SessionProgress, "resume": SessionProgress, "cancel": SessionProgress,
    "failures": list[Failure], "outcomes": OutcomesAnswer, "redeliveries": RedeliveryAnswer,
    "create": Job, "validate": ValidManifest, "list_jobs": JobPage, "show": Job, "change": JobSummary,
    "attempts": Attempts, "logs": LogPage, "metrics": JobMetrics, "report": ReportAnswer,
    "list_quotas": QuotaList, "show_quotas": UserPolicy, "set_quotas": UserPolicy, "clear_quotas": UserPolicy,
}
