"""A warm start for local learners: one process that has imported the learner's modules (labswarm, torch and
``torch._dynamo``, which torch's optimizers load on first use) forks each learner instead of starting a new
interpreter (``LABSWARM_LEARNER_WARM_START``, :class:`~labswarm.deploy.warm.WarmStarter`).

A learner's start costs ~4 s of CPU in imports (measured on this project's 2-core machines: labswarm's own
0.7 s, torch 2 s, ``torch._dynamo`` 1.5 s) for a job that may train for less than a second; a fork costs
milliseconds. The idea is the zygote of Android and of :mod:`multiprocessing`'s ``forkserver`` with ``preload``.

Protocol (one JSON object a line): the launcher writes requests on this process's stdin::

    {"spec": PATH, "env": {...}, "out": PATH, "cwd": PATH, "cores": [0] | null,
     "join": [".../cgroup.procs", ...], "fallback": {...} | null, "arenas": "2" | null}

and reads on its stdout ``{"pid": N}`` for each request, in order, and ``{"exit": N, "code": C}`` when a learner
it forked ended (``C``: its exit status, ``-S`` for a signal S). The child does what the launcher's shell and
``Popen`` would: a session of its own, its output appended to ``out``, pinned to ``cores``, moved into its
cgroups (``join``; a failure: :data:`~labswarm.deploy.cgroups.JOIN_FAILED`, then the ``fallback`` variables, or
with ``fallback`` null the exit :data:`~labswarm.deploy.cgroups.EXIT_JOIN`), the environment replaced by
``env``, glibc's arenas capped (``arenas``: ``MALLOC_ARENA_MAX`` is read only at a process's start), then
:func:`labswarm.jobs.learner.entry.main`. End of stdin ends this process; the learners it forked go on.

Fork-safety: this process stays single-threaded and never runs torch's thread pools, so a forked child holds no
lock another thread owned; what a learner reads at import (``OMP_NUM_THREADS``) is this process's: the trainer
sets its own thread count (``training.threads``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
from typing import Any

#: glibc's ``mallopt`` parameter for the arenas' cap (``M_ARENA_MAX``, malloc.h).
M_ARENA_MAX = -8


def preload() -> None:
    """Import what every learner imports (its entry point, torch, ``torch._dynamo``)."""
    import labswarm.jobs.learner.entry  # noqa: F401

    with contextlib.suppress(ImportError):  # a manager without torch still warm-starts command learners
        import torch
        import torch._dynamo
        import torch.optim  # noqa: F401


def _join(paths: list[str]) -> str | None:
    """Write this process's pid into each ``cgroup.procs``; the first error, ``None`` when all were written."""
    for path in paths:
        try:
            with open(path, "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
    return None


def child(request: dict[str, Any]) -> int:
    """In the forked child: become the learner ``request`` describes; returns its exit code."""
    from labswarm.deploy.cgroups import CGROUP_ENV, EXIT_JOIN, JOIN_FAILED
    from labswarm.jobs.learner import entry

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    env = dict(request["env"])
    if request.get("cores"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, request["cores"])
    failed = _join(request.get("join") or [])
    if failed is not None:
        fallback = request.get("fallback")
        print(f"{JOIN_FAILED} ({failed})" + (": the fallback instead" if fallback is not None else ""),
              file=sys.stderr, flush=True)
        if fallback is None:
            return EXIT_JOIN
        env.pop(CGROUP_ENV, None)
        env.update(fallback)
    os.environ.clear()
    os.environ.update(env)
    arenas = env.get("MALLOC_ARENA_MAX")
    if arenas and arenas.isdigit():
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).mallopt(M_ARENA_MAX, int(arenas))
    with contextlib.suppress(OSError):
        os.chdir(request.get("cwd") or os.getcwd())
    sys.argv = [entry.__file__, request["spec"]]
    return entry.main([request["spec"]])


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap() -> None:
    """Report every forked learner that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _fork(request: dict[str, Any]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 70  # EXIT_PLATFORM, should the child itself fail
        try:
            code = child(request)
        except BaseException as exc:  # the child must end here, whatever happened
            with contextlib.suppress(Exception):
                print(f"the warm-started learner failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
    _send({"pid": pid})


def serve() -> None:
    """Preload, then fork a learner per request line on stdin until stdin ends (see the module docstring)."""
    preload()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd is written
    buffer = b""
    while True:
        ready, _, _ = select.select([0, wake_read], [], [])
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        _reap()
        if 0 in ready:
            chunk = os.read(0, 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    _fork(json.loads(line))


if __name__ == "__main__":
    serve()
