"""The maths libraries' thread pools of this process (BLAS, OpenMP, numba).

Two processes on two cores, each with the libraries' default pools, run slower than one plain loop; with one
thread each they scale (measured in ../shared/RUNBOOK.md, "Audio"). Every process that computes features or
batches (local pool workers, Celery workers, prefetch producers, torch data workers) calls :func:`limit_threads`.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Mapping

#: Address space one glibc malloc arena reserves on a 64-bit system (glibc's ``HEAP_MAX_SIZE``:
#: ``2 * DEFAULT_MMAP_THRESHOLD_MAX``, 64 MiB), resident or not.
ARENA_BYTES = 64 * 2**20
#: A new thread's stack where neither :func:`threading.stack_size` nor ``RLIMIT_STACK`` sets it (Linux's default
#: ``RLIMIT_STACK``, 8 MiB; glibc's own default under an unlimited ``RLIMIT_STACK`` is smaller).
STACK_BYTES = 8 * 2**20


def usable_cores() -> list[int]:
    """The CPU cores this process may run on, in order, at least one: ``os.sched_getaffinity`` (which honours
    ``taskset`` and cgroup cpusets), or every core ``os.cpu_count()`` counts where it does not exist (not Linux)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def thread_address_space(threads: int, environ: Mapping[str, str] | None = None) -> int:
    """Bytes of address space ``threads`` new threads of this process may reserve: what counts against an
    ``RLIMIT_AS`` (not resident memory). Each thread's stack: :func:`threading.stack_size` where set, else the
    ``RLIMIT_STACK`` soft limit (the size glibc gives a new thread's stack), else :data:`STACK_BYTES` where that is
    unlimited; plus the malloc arenas the threads may create, :data:`ARENA_BYTES` each: ``MALLOC_ARENA_MAX - 1`` at
    most where ``environ`` (default ``os.environ``) caps them (the main arena is there already; the local
    launcher's 2 for a limited learner: one), else one per thread (glibc's default allows 8 arenas per core).
    Measured (x86-64, glibc, 8 MiB stacks): a ``ThreadPoolExecutor(8)`` adds 128 MiB of ``VmSize`` with
    ``MALLOC_ARENA_MAX=2`` (8 stacks and one arena), 576 MiB without (8 stacks and 8 arenas).

    Args:
        threads: new threads (>= 0).
        environ: where ``MALLOC_ARENA_MAX`` is read; default ``os.environ``.

    Returns:
        Bytes; 0 for no thread.
    """
    if threads <= 0:
        return 0
    stack = threading.stack_size()
    if not stack:
        soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
        stack = STACK_BYTES if soft == resource.RLIM_INFINITY else soft
    cap = (os.environ if environ is None else environ).get("MALLOC_ARENA_MAX", "").strip()
    arenas = min(threads, int(cap) - 1) if cap.isdigit() and int(cap) > 0 else threads  # 0: glibc's default
    return threads * stack + arenas * ARENA_BYTES


def limit_threads(n: int = 1) -> None:
    """Limit the BLAS / OpenMP / numba thread pools of this process to ``n`` threads.

    Sets ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``NUMBA_NUM_THREADS`` (read by
    libraries imported later) and limits the pools already loaded through threadpoolctl.

    Args:
        n: threads per pool (>= 1).
    """
    from threadpoolctl import threadpool_limits

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(n)
    threadpool_limits(n)
