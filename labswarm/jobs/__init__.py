"""Training jobs as a service (issue 12).

This package's public surface is below: the manifest, the job states and their transitions, the error codes
that tell the user's faults from the platform's, the learners' exit codes. The service's parts live in their
modules, imported where used (they pull in the database, HTTP or torch):

- :mod:`labswarm.jobs.spec`: what a job is (states, error codes, the results store's layout); the manifest
  schema itself is :mod:`labswarm.config.manifest`;
- :mod:`labswarm.jobs.records`: what the database holds of a job, shared by the service and the lifecycle: the
  tables, the event stream (the one write point of a job's state), the attempt credentials;
- :mod:`labswarm.jobs.service`: ``JobService`` (submit, control, reports), its reads, the bundle, the ``/v1/jobs``
  routes;
- :mod:`labswarm.jobs.lifecycle`: the lifecycle pass and watchdog, deploys, outcomes (restarts, completion,
  failure), a distributed job's cluster (coordinator, shards), given a runtime context (database, lock, settings,
  results stores) rather than the service; learners are started by the launchers of :mod:`labswarm.deploy`;
- :mod:`labswarm.jobs.learner`: what runs inside a learner process (``python -m labswarm.jobs.learner.entry
  SPEC.json``): its spec and context, the trainer's job hooks, the ``command`` framework, the reporter;
- :mod:`labswarm.jobs.client`: ``JobsClient``, following a job's events, plots (``labswarm jobs`` is in
  :mod:`labswarm.cli.jobs`).
"""

from labswarm.config.manifest import (
    DEFAULT_USER_EXIT_CODES,
    CommandFramework,
    DistributedFramework,
    JobManifest,
    LabswarmFramework,
    MetricsSource,
    Resources,
    RestartPolicy,
    load_manifest,
    parse_manifest,
)
from labswarm.jobs.spec.errors import (
    ERROR_TEXT,
    EXIT_HALTED,
    EXIT_PLATFORM,
    EXIT_STORAGE,
    EXIT_USER,
    ErrorCode,
    ExitVerdict,
    Fault,
    classify_exit,
)
from labswarm.jobs.spec.states import HOLDS_SLOTS, TERMINAL, TRANSITIONS, InvalidTransition, JobState, check_transition

__all__ = [
    "DEFAULT_USER_EXIT_CODES",
    "ERROR_TEXT",
    "EXIT_HALTED",
    "EXIT_PLATFORM",
    "EXIT_STORAGE",
    "EXIT_USER",
    "HOLDS_SLOTS",
    "TERMINAL",
    "TRANSITIONS",
    "CommandFramework",
    "DistributedFramework",
    "ErrorCode",
    "ExitVerdict",
    "Fault",
    "InvalidTransition",
    "JobManifest",
    "JobState",
    "LabswarmFramework",
    "MetricsSource",
    "Resources",
    "RestartPolicy",
    "check_transition",
    "classify_exit",
    "load_manifest",
    "parse_manifest",
]
