"""``python -m labswarm.cli.standby``: the warm parent of a run's local workers, started before their session
(:mod:`labswarm.deploy.standby`): it imports what ``labswarm worker`` imports and warms up the experiment it is
given, once, then forks a worker for each command line it reads and runs that command in the child (the protocol:
:mod:`labswarm.deploy.standby`). It exits 0 when its stdin ends (the run ended or did not need it); the workers it
forked go on (each ends with its launcher, :mod:`labswarm.deploy.lifeline`). Its stderr is the run's
``standby.log`` (a warm-up that failed: its traceback), its stdout the answers alone.

Fork-safety: this process stays single-threaded (the maths libraries get one thread each from the launcher's
environment, nothing here starts a thread or opens a connection before it forks), and the objects of its imports
and warm-up are frozen (``gc.freeze``) so that the workers' collections do not copy their pages.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import select
import signal
import sys
import traceback
from typing import Any

#: A child's exit status should its own code fail before the command runs (sysexits' EX_SOFTWARE).
EXIT_FAILED = 70

#: The descriptor of the answers to the launcher (the stdout it reads; :func:`main` points stdout itself elsewhere,
#: so that nothing a library prints gets into the answers).
_answers = 1


class _Lines:
    """Lines read from a descriptor (stdin) with ``os.read``, so that what one read brought in stays for the next
    (a command line sent right after the config line) and ``select`` on the descriptor tells the truth."""

    def __init__(self, fd: int = 0) -> None:
        self.fd, self.buffer, self.ended = fd, b"", False

    def fill(self) -> None:
        """One ``os.read`` (blocks when nothing is there); at the end of the stream :attr:`ended` is set."""
        chunk = os.read(self.fd, 65536)
        self.ended = not chunk
        self.buffer += chunk

    def take(self) -> dict[str, Any] | None:
        """The next whole line already read, as a JSON object (blank lines skipped); ``None`` when none is."""
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                return _parse(line)
        return None

    def next(self) -> dict[str, Any] | None:
        """The next line as a JSON object, reading until one is whole; ``None`` at the end of the stream."""
        while (value := self.take()) is None:
            if self.ended:
                return None
            self.fill()
        return value


def _parse(line: bytes | str) -> dict[str, Any]:
    """A protocol line as a JSON object.

    Raises:
        ValueError: not JSON, or not an object.
    """
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
    """Send this process's stdout and stderr to ``path`` (appended; ``None``: nowhere), its stdin from nowhere."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run(command: dict[str, Any]) -> int:
    """Run ``command``'s ``labswarm`` arguments in this process (a forked child); its exit status."""
    _redirect(command.get("log"))
    os.environ.update({str(k): str(v) for k, v in (command.get("env") or {}).items()})
    from labswarm.cli.main import app

    try:
        app(args=[str(a) for a in command["argv"]], prog_name="labswarm")
    except SystemExit as exc:  # the command line's own exit (click's standalone mode)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _child(command: dict[str, Any], fds: tuple[int, ...]) -> None:
    """In a forked child: a session of its own (the launcher kills a worker as a process group), the parent's
    descriptors and handlers dropped, then the command; never returns (``os._exit``: the parent's atexit
    handlers are not this worker's, and the frozen objects need no collection at exit)."""
    code = EXIT_FAILED
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in fds:
            os.close(fd)
        os.setsid()
        code = _run(command)
    except BaseException as exc:  # the child must end here, whatever happened
        with contextlib.suppress(Exception):
            print(f"the forked worker failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(Exception):
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _send(message: dict[str, Any]) -> None:
    os.write(_answers, (json.dumps(message) + "\n").encode())


def _reap() -> None:
    """Report each forked worker that ended: ``{"exit": pid, "code": status}`` (``-S``: killed by signal S)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(lines: _Lines) -> None:
    """Fork a worker per command line on stdin (answering ``{"pid": N}`` for each, in order), report the ends of
    those forked, until stdin ends."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up descriptor is written
    while True:
        while (command := lines.take()) is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(command, (wake_read, wake_write, _answers))
            _send({"pid": pid})
        if lines.ended:
            return
        ready, _, _ = select.select([lines.fd, wake_read], [], [])
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        _reap()
        if lines.fd in ready:
            lines.fill()


def main() -> int:
    """Warm up, then fork the workers asked for until stdin ends (exits 0), or at once with nothing read (0)."""
    global _answers
    _answers = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # what the imports print goes nowhere: the answers' descriptor is the launcher's only
    os.close(null)
    lines = _Lines(0)
    first = lines.next()
    if first is None:
        return 0
    # no collection while the worker's modules are imported and warmed up, then their objects out of the
    # collector's sight (gc.freeze: no copy of their pages in the forked workers, whose own freeze then has only
    # what came since). Unlike run_worker, no collection before the freeze: the one full collection of the ~210,000
    # objects took 0.16 s of CPU on the run's critical path (the 2-core machine) and found ~6,800 objects of
    # garbage, kept (frozen) for the parent's life instead, their pages shared by its workers
    gc.disable()
    try:
        _warm(first.get("config") or {})
    except Exception:  # the worker's own start reports it too, in its log; the parent still forks
        traceback.print_exc(file=sys.stderr)
        print("the standby workers' warm-up failed: their own start warms them up", file=sys.stderr, flush=True)
    finally:
        gc.freeze()
        gc.enable()
    serve(lines)
    # at once: nothing to flush or close (its answers are written unbuffered), and the interpreter's own exit with
    # the audio libraries loaded took 0.11-0.23 s of the run's end (the run waits for it; load ~6)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
