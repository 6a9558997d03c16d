"""``python -m labswarm.cli.standby``: a local worker's interpreter started before its session
(:mod:`labswarm.deploy.standby`): it imports what ``labswarm worker`` imports and warms up the experiment it is
given, then waits for its command line and runs it (the protocol: :mod:`labswarm.deploy.standby`). It exits 0
without running anything when its stdin ends first (the run ended or did not need it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

from labswarm.gcpause import collector_paused


def _read(stream) -> dict[str, Any] | None:
    """The next JSON object line of ``stream``; ``None`` at its end."""
    line = stream.readline()
    if not line:
        return None
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError(f"a standby worker reads JSON objects, got {type(value).__name__}")
    return value


def _warm(config: dict[str, Any]) -> None:
    """Import the worker's modules and warm up ``config``'s transformations and features (none when empty)."""
    import labswarm.cli.main  # noqa: F401 - the command line the worker runs
    from labswarm.queue.worker import warm_up  # Celery and the worker's parts

    if config:
        from labswarm.config.experiment import ExperimentConfig

        warm_up(ExperimentConfig.model_validate(config))  # the worker's own warm-up then does not run it again


def _redirect(path: str | None) -> None:
    """Send this process's stdout and stderr to ``path`` (appended; ``None``: nowhere)."""
    fd = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main() -> int:
    """Warm up, wait for the command, run it; the exit status is the command's (0 when none came)."""
    stdin = sys.stdin
    first = _read(stdin)
    if first is None:
        return 0
    # as run_worker does: no collection while the worker's modules are imported and warmed up, then their objects
    # out of the collector's sight (the worker's own freeze before it forks then has only what came since)
    with collector_paused(freeze=True), contextlib.suppress(Exception):  # the worker's own start reports a broken
        _warm(first.get("config") or {})  # config or library, in its log
    command = _read(stdin)
    if command is None:
        return 0
    _redirect(command.get("log"))
    os.environ.update({str(k): str(v) for k, v in (command.get("env") or {}).items()})
    from labswarm.cli.main import app

    app(args=[str(a) for a in command["argv"]], prog_name="labswarm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
