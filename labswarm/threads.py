"""The maths libraries' thread pools of this process (BLAS, OpenMP, numba).

Two processes on two cores, each with the libraries' default pools, run slower than one plain loop; with one
thread each they scale (measured in ../shared/RUNBOOK.md, "Audio"). Every process that computes features or
batches (local pool workers, Celery workers, prefetch producers, torch data workers) calls :func:`limit_threads`.
"""

from __future__ import annotations

import os


def usable_cores() -> list[int]:
    """The CPU cores this process may run on, in order, at least one: ``os.sched_getaffinity`` (which honours
    ``taskset`` and cgroup cpusets), or every core ``os.cpu_count()`` counts where it does not exist (not Linux)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


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
