"""Shared-memory segments of the prefetch slot rings (:mod:`labswarm.pipeline.shm`): created, reserved, attached
without the resource tracker, unlinked, and the segments of dead trainers swept.

A segment's name is ``labswarm_<pid namespace>_<pid>_<random>``, so that a trainer can tell the segments that
dead trainers of its own pid namespace left behind (killed together with their resource tracker) from those of
live processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
from collections.abc import Iterator, Sized
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

log = logging.getLogger(__name__)

#: Segment names start with this, then ``<pid namespace>_<pid of the trainer>_``.
PREFIX = "labswarm_"
#: Slot sizes (and so segment sizes) are multiples of this many bytes (64 KiB).
GRAIN = 64 * 2**10


def namespace() -> str:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), in hex: a pid means something only
    within its namespace, so stale segments are judged only against the trainers of the same one."""
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        return "0"


_swept = False


def sweep_stale(root: str = "/dev/shm") -> list[str]:
    """Unlink the segments that dead trainers of this pid namespace left behind (a trainer killed together with
    its resource tracker); segments of live processes, and of other namespaces, are left alone.

    Returns:
        The names unlinked.
    """
    import psutil

    mine = f"{PREFIX}{namespace()}_"
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(mine):
                continue
            pid = name[len(mine):].split("_", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid() or psutil.pid_exists(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
                removed.append(name)
    if removed:
        log.warning("removed %d shared-memory segments left by dead trainers: %s", len(removed), removed)
    return removed


def round_up(n: int) -> int:
    return max(GRAIN, -(-n // GRAIN) * GRAIN)


def create(size: int) -> SharedMemory:
    """A new segment of ``size`` bytes (its memory not yet taken), registered with the resource tracker, which
    unlinks it if this process is killed.

    Raises:
        OSError: it cannot be created (too many open files, no ``/dev/shm``).
    """
    global _swept
    if not _swept:
        _swept = True
        sweep_stale()
    while True:
        try:
            return SharedMemory(f"{PREFIX}{namespace()}_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=size)
        except FileExistsError:
            continue


def reserve(shm: SharedMemory) -> None:
    """Take a segment's memory now, so that writing it cannot fail with ``SIGBUS`` (POSIX; elsewhere a no-op).

    Raises:
        OSError: ``/dev/shm`` is full (``ENOSPC``).
    """
    fd = getattr(shm, "_fd", -1)  # the segment's file descriptor: SharedMemory has no public way to it
    if fd >= 0 and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, shm.size)


def attach(name: str) -> SharedMemory:
    """The existing segment ``name``, attached without registering it with the resource tracker."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name, track=False)
    with untracked(name):
        return SharedMemory(name)


@contextlib.contextmanager
def untracked(name: str) -> Iterator[None]:
    """Skip the resource tracker's registration of segment ``name`` (what ``SharedMemory(name)`` does before
    Python 3.13); restored on exit."""
    register = resource_tracker.register
    segment = name.lstrip("/")

    def skip(name: Sized, rtype: str) -> None:  # register's signature (typeshed: a Sized name; a str in fact)
        if rtype != "shared_memory" or not isinstance(name, str) or name.lstrip("/") != segment:
            register(name, rtype)

    resource_tracker.register = skip
    try:
        yield
    finally:
        resource_tracker.register = register


def unlink(shm: SharedMemory) -> None:
    with contextlib.suppress(BufferError):  # a view still alive: the mapping goes when the view does
        shm.close()
    with contextlib.suppress(FileNotFoundError):
        shm.unlink()


def release(segments: dict[int, SharedMemory], owner: int) -> None:
    """Unlink a ring's segments (its finalizer): in the process that created them only, not in a forked child's
    copy of the ring."""
    if os.getpid() != owner:
        return
    for shm in segments.values():
        unlink(shm)
    segments.clear()
