"""Training jobs as a service (issue 12).

This package's public surface is below: the manifest, the job states and their transitions, the error codes
that tell the user's faults from the platform's, the learners' exit codes. The service's parts live in their
modules, imported where used (they pull in the database, HTTP or torch):

- :mod:`~labswarm.jobs.service` (``JobService``: submit, control, reports; its reads in
  :mod:`~labswarm.jobs.queries`), :mod:`~labswarm.jobs.lifecycle` (the pass and the watchdog;
  :mod:`~labswarm.jobs.outcomes`: restarts, completion, failure; :mod:`~labswarm.jobs.deployer`: queue and
  deploys), :mod:`~labswarm.jobs.events` (the event stream and state changes), :mod:`~labswarm.jobs.models`
  (tables), :mod:`~labswarm.jobs.processes` (local learner processes), :mod:`~labswarm.jobs.api` (``/v1/jobs``);
- :mod:`~labswarm.jobs.learner` (``python -m labswarm.jobs.learner SPEC.json``), :mod:`~labswarm.jobs.reporter`,
  :mod:`~labswarm.jobs.command` (the ``command`` framework), :mod:`~labswarm.jobs.layout` (the results store's
  layout and checkpoint pointer), :mod:`~labswarm.jobs.storage` (``local``, ``s3``);
- :mod:`~labswarm.jobs.client` (``JobsClient``), :mod:`~labswarm.jobs.cli` (``labswarm jobs``),
  :mod:`~labswarm.jobs.bundle`.
"""

from labswarm.jobs.errors import (
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
from labswarm.jobs.manifest import (
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
from labswarm.jobs.states import HOLDS_SLOTS, TERMINAL, TRANSITIONS, InvalidTransition, JobState, check_transition

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
