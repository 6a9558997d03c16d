"""A local learner's ``resources.cpus`` and ``resources.memory_mb`` enforced without cgroups (issue 26 item 4).

The pinning applies to every local learner; the memory limit is the fallback where the learner gets no cgroup of
its own (:mod:`labswarm.deploy.cgroups`: none writable here, ``learner_cgroups`` off, or a learner placed on another
host):

- **CPUs**: the learner is pinned (``sched_setaffinity``) to ``ceil(cpus)`` of the cores the manager may run on,
  the ones fewest other local learners are pinned to (:func:`pick_cores`); its threads and children inherit the
  mask, and PyTorch's and OpenMP's thread pools size themselves from it. A fraction (``cpus: 0.5``) gets a whole
  core; ``cpus`` of the machine's cores or more leaves the learner unpinned.
- **Memory**: the learner sets its own ``RLIMIT_AS`` soft limit to ``memory_mb`` MiB plus an allowance for its
  threads' stacks once its modules are imported (:func:`apply_memory_limit`, read from :data:`MEMORY_ENV`, which
  the launcher sets; the limit is *address space*, not resident memory: each thread reserves its whole stack,
  8 MiB, and PyTorch starts about two threads per intra-op thread, so :data:`THREAD_MIB` per thread of
  :func:`expected_threads`: 4 GiB more on an unpinned 256-core machine, nothing resident), so an allocation
  past it fails (``MemoryError``, or PyTorch's "can't allocate memory") instead of the kernel's OOM killer ending
  the machine's biggest process; the learner then exits with its own code (``EXIT_MEMORY``, error ``C107``: the
  user's fault) and says so in its log. Its children (a ``command`` learner's program, data-loading processes)
  inherit the limit, each for itself: ``RLIMIT_AS`` bounds one process's address space, not the learner's sum,
  and counts reserved address space, not only resident memory; so the launcher also caps glibc's malloc arenas
  (``MALLOC_ARENA_MAX=2`` unless set: each arena reserves 64 MiB of address space). A learner with GPUs gets no
  address-space limit (CUDA reserves far more address space than it uses).
  A native library that cannot get address space may end the process itself instead of raising: libgomp
  (PyTorch's OpenMP) prints "Thread creation failed" and calls ``exit(1)``. :func:`watch_native_exit` catches
  such an exit (glibc's ``on_exit``) when the address space is within :data:`EXIT_HEADROOM_MIB` of the limit, so
  the learner still ends with ``EXIT_MEMORY`` (``C107``) and its message instead of a crash (``S101``).
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import math
import os
import resource
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from labswarm.threads import usable_cores

#: The variable through which the local launcher tells a learner how its resources are enforced (a cgroup and its
#: limits, or this fallback); the learner logs it as it starts.
LIMITS_ENV = "LABSWARM_LEARNER_LIMITS"
#: The variable through which the local launcher gives a learner its memory limit, in MiB.
MEMORY_ENV = "LABSWARM_MEMORY_LIMIT_MB"
#: glibc arenas a limited learner may create (``MALLOC_ARENA_MAX``; glibc's default is 8 per core).
ARENAS = "2"
#: Address space allowed per expected thread, MiB, over ``memory_mb``: measured on x86-64 Linux (glibc, 8 MiB
#: stacks, ``MALLOC_ARENA_MAX=2``): 64 PyTorch threads add 126 threads and 1,070 MiB of address space (8.2 MiB a
#: thread, two per PyTorch thread), so 16 a PyTorch thread.
THREAD_MIB = 16
#: A native ``exit`` while the address space is within this many MiB of the limit counts as out of memory
#: (:func:`watch_native_exit`): a thread's stack (8 MiB) or a large block (a tensor) did not fit.
EXIT_HEADROOM_MIB = 64


def pick_cores(cpus: float, busy: Iterable[Iterable[int]], cores: list[int] | None = None) -> list[int] | None:
    """The cores to pin a learner of ``cpus`` CPUs to: ``ceil(cpus)`` of ``cores`` (default :func:`usable_cores`),
    those the fewest other learners' masks in ``busy`` hold (then the lowest numbers); ``None``: do not pin
    (``cpus`` covers every core)."""
    cores = usable_cores() if cores is None else cores
    wanted = max(1, math.ceil(cpus))
    if wanted >= len(cores):
        return None
    load = dict.fromkeys(cores, 0)
    for mask in busy:
        for core in mask:
            if core in load:
                load[core] += 1
    return sorted(sorted(cores, key=lambda core: (load[core], core))[:wanted])


def memory_limit_env(resources: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a learner of ``resources`` its memory limit (:data:`MEMORY_ENV` and, unless
    ``environ`` sets it, ``MALLOC_ARENA_MAX``); none for a learner with GPUs or without ``memory_mb``."""
    memory = resources.get("memory_mb")
    if not memory or int(resources.get("gpus") or 0) > 0:
        return {}
    out = {MEMORY_ENV: str(int(memory))}
    if "MALLOC_ARENA_MAX" not in environ:
        out["MALLOC_ARENA_MAX"] = ARENAS
    return out


def expected_threads() -> int:
    """The threads PyTorch's and OpenMP's pools will start in this process: the largest of the cores it may run
    on (the pools' default), ``OMP_NUM_THREADS`` (its first level) and ``torch.get_num_threads()`` (when torch is
    imported), at least 1."""
    counts = [len(usable_cores())]
    omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if omp.isdigit():
        counts.append(int(omp))
    torch = sys.modules.get("torch")
    if torch is not None:
        counts.append(int(torch.get_num_threads()))
    return max(1, *counts)


def apply_memory_limit(environ: Mapping[str, str] | None = None, threads: int | None = None) -> int | None:
    """Set this process's ``RLIMIT_AS`` soft limit to :data:`MEMORY_ENV` MiB plus :data:`THREAD_MIB` per thread
    (``threads``, default :func:`expected_threads`) (the hard limit stays, so :func:`lift_memory_limit` can lift
    it to report an overrun); returns the limit in bytes, ``None`` without one.

    Raises:
        ValueError: :data:`MEMORY_ENV` is not a positive integer.
    """
    text = (os.environ if environ is None else environ).get(MEMORY_ENV)
    if not text:
        return None
    megabytes = int(text)
    if megabytes <= 0:
        raise ValueError(f"{MEMORY_ENV} must be a positive number of MiB, not {text!r}")
    limit = (megabytes + THREAD_MIB * (expected_threads() if threads is None else threads)) * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def lift_memory_limit() -> None:
    """Lift the soft ``RLIMIT_AS`` to the hard one: the learner may log, report and exit after an overrun."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an allocation that failed: ``MemoryError`` (numpy's
    too), PyTorch's ``RuntimeError`` from its CPU allocator ("can't allocate memory"), an ``OSError`` of
    ``ENOMEM`` or a shared library that could not be mapped (dlopen's "failed to map segment")."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, MemoryError):
            return True
        if isinstance(seen, RuntimeError) and ("can't allocate memory" in str(seen)
                                               or "not enough memory" in str(seen)):
            return True
        if isinstance(seen, OSError) and (seen.errno == errno.ENOMEM or "failed to map segment" in str(seen)):
            return True  # mmap refused; a shared library (torch's) that cannot be mapped in
        seen = seen.__cause__ or seen.__context__
    return False


#: glibc's ``on_exit`` handler type, the one registered handler (kept alive), and what it calls.
_ON_EXIT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)
_watch: dict[str, Any] = {}
_callbacks: dict[str, Any] = {}


def address_space_mib() -> int:
    """This process's address space (``VmSize`` of ``/proc/self/status``), MiB; 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _native_exit(status: int, _arg: object) -> None:
    """glibc's ``on_exit`` handler: a native library's ``exit(status)`` with the address space full becomes
    the watcher's exit (see :func:`watch_native_exit`); anything else exits as it would."""
    handler = _watch.get("handler")
    if status == 0 or handler is None or _watch.get("pid") != os.getpid():
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    used = address_space_mib()
    if soft == resource.RLIM_INFINITY or soft // 2**20 - used > EXIT_HEADROOM_MIB:
        return
    _watch.clear()
    lift_memory_limit()  # room to log, report and exit
    message = (f"a native library ended the process (exit status {status}) with its address space full: "
               f"{used} MiB of {soft // 2**20} MiB (RLIMIT_AS: resources.memory_mb plus {THREAD_MIB} MiB per "
               f"thread); libgomp does so when it cannot create a thread ('Thread creation failed'): raise "
               f"resources.memory_mb or start fewer threads (OMP_NUM_THREADS, torch.set_num_threads)")
    code = 1
    try:
        code = handler(message)
    finally:
        os._exit(code)


def _guard() -> None:
    """At Python's own exit (:mod:`atexit`): have glibc end the process with ``_exit(status)`` before it calls
    the watcher's handler, which may not run once the interpreter is gone (glibc calls its exit handlers last
    registered first; ``_exit`` ignores the extra argument). C libraries' exit handlers are skipped then."""
    libc = ctypes.CDLL(None)
    libc.on_exit(libc._exit, None)


def watch_native_exit(handler: Callable[[str], int]) -> bool:
    """From now on, turn a native library's ``exit`` with a non-zero status while the address space is within
    :data:`EXIT_HEADROOM_MIB` of the ``RLIMIT_AS`` soft limit (libgomp's "Thread creation failed" past
    :func:`apply_memory_limit`) into ``handler(message)``: the handler logs the message and returns the exit code
    the process then ends with (``os._exit``; the learner's ``EXIT_MEMORY``). Any other exit is left alone, as are
    forked children; Python's own exit keeps its status (:func:`_guard`) but skips C libraries' exit handlers.

    Returns:
        Whether the watch is set (glibc's ``on_exit`` found; not on other C libraries).
    """
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "on_exit") or not hasattr(libc, "_exit"):
        return False
    if "callback" not in _callbacks:
        _callbacks["callback"] = _ON_EXIT(_native_exit)  # kept alive: glibc holds its address
        libc.on_exit(_callbacks["callback"], None)
        atexit.register(_guard)
    _watch.update(handler=handler, pid=os.getpid())
    return True
