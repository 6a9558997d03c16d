"""The exit status of every ``labswarm`` command: one meaning per code, the same in every command
(:data:`MEANINGS`; the command-line reference renders that table).

:func:`exit_code` maps an exception to its code; :func:`labswarm.cli.output.fail` prints it and returns the
:class:`typer.Exit` with that code. typer's own usage errors (an unknown option, a value out of bounds) exit 2
as well.
"""

from __future__ import annotations

from labswarm.errors import (
    BrokerError,
    ConfigError,
    Conflict,
    DatasetError,
    DeployError,
    ManagerError,
    NotFound,
    PublishError,
    StorageError,
    StoreError,
)

#: Everything asked was done.
OK = 0
#: The command ran to its end, but some of its work failed (samples, files, a training job).
FAILED = 1
#: Usage or configuration error, found before any work started.
USAGE = 2
#: A service (manager, broker, store, Docker engine) cannot be reached or failed.
INFRASTRUCTURE = 3
#: Interrupted (Ctrl-C, SIGINT): 128 + 2, as shells report it.
INTERRUPTED = 130

#: Each exit status and what it means, as the command-line reference shows them.
MEANINGS: tuple[tuple[int, str], ...] = (
    (OK, "everything asked was done"),
    (FAILED, "the command ran to its end, but some of its work failed: samples (each listed with its reason), "
             "files `predict` could not classify, a training job that ended `failed`, a cancelled session"),
    (USAGE, "usage or configuration error, found before any work started: a bad option, an invalid experiment or "
            "manifest (each field with its dotted path; an unknown key with the closest known one), a missing "
            "labels CSV, audio file or folder, an unknown id, a request the manager refuses as such (HTTP 4xx: "
            "a wrong token, a change the current state forbids)"),
    (INFRASTRUCTURE, "infrastructure failure: the manager, broker, feature store, results store or Docker engine "
                     "cannot be reached or failed (HTTP 5xx or 429, a session whose publisher or launcher "
                     "failed); the configuration may be fine: try again once the service is back"),
    (INTERRUPTED, "interrupted (Ctrl-C); what the command started is stopped"),
)

#: Errors that say the request or the configuration is wrong.
_USAGE_ERRORS = (ConfigError, DatasetError, NotFound, Conflict)
#: Errors that say a service is down or refused to serve.
_INFRASTRUCTURE_ERRORS = (BrokerError, PublishError, DeployError, StoreError, StorageError)


def exit_code(exc: BaseException) -> int:
    """The exit status a command ends with when ``exc`` stops it (see the module's table)."""
    if isinstance(exc, ManagerError):
        if exc.status is None or exc.status >= 500 or exc.status == 429:
            return INFRASTRUCTURE  # unreachable, failing, or asking to come back later
        return USAGE
    if isinstance(exc, _USAGE_ERRORS):
        return USAGE
    if isinstance(exc, _INFRASTRUCTURE_ERRORS):
        return INFRASTRUCTURE
    return FAILED  # a sample's error (SampleError) or any other: the work did not all succeed
