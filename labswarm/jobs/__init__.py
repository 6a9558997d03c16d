"""Training jobs as a service (issue 12): the manifest, the job states and their transitions, the error codes
that tell the user's faults from the platform's, and the storage plugins of the data and results stores.

The lifecycle manager, the routes and the event stream build on these."""

from labswarm.jobs.errors import ERROR_TEXT, ErrorCode, ExitVerdict, Fault, classify_exit
from labswarm.jobs.manifest import (
    DEFAULT_USER_EXIT_CODES,
    CommandFramework,
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
    "DEFAULT_USER_EXIT_CODES", "ERROR_TEXT", "HOLDS_SLOTS", "TERMINAL", "TRANSITIONS", "CommandFramework",
    "ErrorCode", "ExitVerdict", "Fault", "InvalidTransition", "JobManifest", "JobState", "LabswarmFramework",
    "MetricsSource", "Resources", "RestartPolicy", "check_transition", "classify_exit", "load_manifest",
    "parse_manifest",
]
