"""Error codes of training jobs: the user's faults (``C1xx``) apart from the platform's (``S1xx``).

The model is FfDL's (IBM DLaaS): a job that fails says whose fault it was, so a user fixes their manifest or
program and an operator looks at the cluster. The two kinds of fault also have separate restart budgets
(``restart.max_restarts_user`` and ``restart.max_restarts_platform`` in the manifest): a user fault is never
retried beyond the user budget (0 by default: a bug does not fix itself), a platform fault is retried from the
last checkpoint within its own.

A learner exit is classified by :func:`classify_exit`. A kill that is part of a halt or a delete is no fault at
all: the lifecycle manager knows it asked for it and does not classify that exit.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Collection
from dataclasses import dataclass

from labswarm.errors import LabswarmError

#: Exit code of a learner (:mod:`labswarm.jobs.learner.entry`): halted on request, after committing a checkpoint
#: (sysexits' EX_TEMPFAIL: "try again later").
EXIT_HALTED = 75
#: Exit code of a learner: the experiment or its data is invalid (the user's fault: in the default
#: ``restart.user_exit_codes``).
EXIT_USER = 2
#: Exit code of a learner: the results store could not be read or written (sysexits' EX_IOERR).
EXIT_STORAGE = 74
#: Exit code of a learner: any other error of the learner (sysexits' EX_SOFTWARE): the platform's fault.
EXIT_PLATFORM = 70
#: Exit code of a learner: an allocation failed past its ``resources.memory_mb`` (the user's fault, ``C107``;
#: :mod:`labswarm.deploy.resource_limits`; sysexits' EX_OSERR, "cannot fork" and the like).
EXIT_MEMORY = 71


class AdminOnly(LabswarmError):
    """A manifest asks for what only an admin may submit: the ``command`` framework, which runs an arbitrary
    program on the manager's machines, or a model from a Python file (``model: {code: FILE.py:Class}``), which
    imports one (HTTP 403 at create and validate). The message names the field."""


class Fault(enum.StrEnum):
    """Whose fault a failure is."""

    USER = "user"
    PLATFORM = "platform"


class ErrorCode(enum.StrEnum):
    """A job's error code; :data:`ERROR_TEXT` holds each one's short text, :attr:`fault` whose fault it is."""

    # the user's faults
    LEARNER_EXIT = "C101"
    COMMAND_NOT_FOUND = "C102"
    COMMAND_NOT_EXECUTABLE = "C103"
    INVALID_MANIFEST = "C104"
    EXPERIMENT_NOT_FOUND = "C105"
    DATA_NOT_FOUND = "C106"
    LEARNER_OVER_MEMORY = "C107"
    # the platform's faults
    LEARNER_CRASHED = "S101"
    LEARNER_SIGNALLED = "S102"
    LEARNER_HUNG = "S103"
    LEARNER_LOST = "S104"
    DEPLOY_FAILED = "S105"
    STORAGE_FAILED = "S106"

    @property
    def fault(self) -> Fault:
        """:attr:`Fault.USER` for ``C`` codes, :attr:`Fault.PLATFORM` for ``S`` codes."""
        return Fault.USER if self.value.startswith("C") else Fault.PLATFORM

    @property
    def text(self) -> str:
        """The code's short text (:data:`ERROR_TEXT`)."""
        return ERROR_TEXT[self]


_C = ErrorCode

#: The short text of each code, as shown by ``labswarm jobs show`` and in the API's ``error`` field.
ERROR_TEXT: dict[ErrorCode, str] = {
    _C.LEARNER_EXIT: "the learner exited with one of the manifest's user exit codes (restart.user_exit_codes)",
    _C.COMMAND_NOT_FOUND: "the learner's command was not found (exit code 127)",
    _C.COMMAND_NOT_EXECUTABLE: "the learner's command is not executable (exit code 126)",
    _C.INVALID_MANIFEST: "the manifest, or the experiment it trains, is invalid",
    _C.EXPERIMENT_NOT_FOUND: "the manifest names an experiment that is not registered",
    _C.DATA_NOT_FOUND: "the data store lacks the data the job reads",
    _C.LEARNER_OVER_MEMORY: "the learner needed more memory than its resources.memory_mb allows (raise it, or "
                            "use less: smaller batches, fewer prefetched batches)",
    _C.LEARNER_CRASHED: "the learner exited with a code the manifest does not count as the user's fault",
    _C.LEARNER_SIGNALLED: "the learner was killed by a signal the platform did not send (often the "
                          "out-of-memory killer)",
    _C.LEARNER_HUNG: "the learner stopped sending heartbeats and was killed by the watchdog",
    _C.LEARNER_LOST: "the learner's process or host was lost; its exit status is unknown",
    _C.DEPLOY_FAILED: "the learner could not be started (launcher, Docker engine or resources)",
    _C.STORAGE_FAILED: "the results store could not be read or written",
}

#: Exit codes a POSIX shell gives a command that cannot run (``exec`` failures), and the learner's own over-memory
#: code, mapped to their codes.
_SHELL_CODES = {127: ErrorCode.COMMAND_NOT_FOUND, 126: ErrorCode.COMMAND_NOT_EXECUTABLE,
                EXIT_MEMORY: ErrorCode.LEARNER_OVER_MEMORY}


@dataclass(frozen=True)
class ExitVerdict:
    """The classification of one learner exit.

    Attributes:
        code: the error code.
        detail: one line for the attempt's ``reason`` (exit code or signal name).
    """

    code: ErrorCode
    detail: str

    @property
    def fault(self) -> Fault:
        """Whose fault the exit is."""
        return self.code.fault


def classify_exit(exit_code: int | None, *, killed_by_platform: bool,
                  user_exit_codes: Collection[int]) -> ExitVerdict | None:
    """Classify a learner's exit into a user or a platform fault.

    Rules, in order: the watchdog killed it (no heartbeat) → ``S103``; the exit status is unknown → ``S104``;
    exit 0 → no fault; :data:`EXIT_MEMORY` → ``C107``; a code in ``user_exit_codes`` → ``C102`` (127), ``C103``
    (126) or ``C101``; killed by a signal nobody on the platform sent (a negative code, as :mod:`subprocess`
    reports it, or ``128 + N`` from a shell) → ``S102``; any other code → ``S101``.

    Args:
        exit_code: the process's exit status (negative: killed by that signal), ``None`` when unknown.
        killed_by_platform: the watchdog (or another part of the platform) killed the learner because it was
            hung. Not for halt or delete kills, which are no fault and are not classified.
        user_exit_codes: the manifest's ``restart.user_exit_codes``.

    Returns:
        The verdict, or ``None`` for a clean exit (0).
    """
    if killed_by_platform:
        what = f"exit status {exit_code}" if exit_code is not None else "exit status unknown"
        return ExitVerdict(ErrorCode.LEARNER_HUNG, f"killed by the watchdog ({what})")
    if exit_code is None:
        return ExitVerdict(ErrorCode.LEARNER_LOST, "exit status unknown")
    if exit_code == 0:
        return None
    if exit_code == EXIT_MEMORY:  # whatever user_exit_codes say: the learner itself found it over its limit
        user_exit_codes = {EXIT_MEMORY}
    if exit_code in user_exit_codes:
        return ExitVerdict(_SHELL_CODES.get(exit_code, ErrorCode.LEARNER_EXIT), f"exit code {exit_code}")
    signum = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else None
    if signum is not None:
        return ExitVerdict(ErrorCode.LEARNER_SIGNALLED, f"exit code {exit_code}: killed by {_signal_name(signum)}")
    return ExitVerdict(ErrorCode.LEARNER_CRASHED, f"exit code {exit_code}")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
