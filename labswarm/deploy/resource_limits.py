"""A local learner's ``resources.cpus`` and ``resources.memory_mb`` enforced without cgroups (issue 26 item 4).

This fallback is used on every machine for now (cgroup v2 delegation is not assumed):

- **CPUs**: the learner is pinned (``sched_setaffinity``) to ``ceil(cpus)`` of the cores the manager may run on,
  the ones fewest other local learners are pinned to (:func:`pick_cores`); its threads and children inherit the
  mask, and PyTorch's and OpenMP's thread pools size themselves from it. A fraction (``cpus: 0.5``) gets a whole
  core; ``cpus`` of the machine's cores or more leaves the learner unpinned.
- **Memory**: the learner sets its own ``RLIMIT_AS`` soft limit to ``memory_mb`` MiB once its modules are
  imported (:func:`apply_memory_limit`, read from :data:`MEMORY_ENV`, which the launcher sets), so an allocation
  past it fails (``MemoryError``, or PyTorch's "can't allocate memory") instead of the kernel's OOM killer ending
  the machine's biggest process; the learner then exits with its own code (``EXIT_MEMORY``, error ``C107``: the
  user's fault) and says so in its log. Its children (a ``command`` learner's program, data-loading processes)
  inherit the limit, each for itself: ``RLIMIT_AS`` bounds one process's address space, not the learner's sum,
  and counts reserved address space, not only resident memory; so the launcher also caps glibc's malloc arenas
  (``MALLOC_ARENA_MAX=2`` unless set: each arena reserves 64 MiB of address space). A learner with GPUs gets no
  address-space limit (CUDA reserves far more address space than it uses).
"""

from __future__ import annotations

import errno
import math
import os
import resource
from collections.abc import Iterable, Mapping
from typing import Any

#: The variable through which the local launcher gives a learner its memory limit, in MiB.
MEMORY_ENV = "LABSWARM_MEMORY_LIMIT_MB"
#: glibc arenas a limited learner may create (``MALLOC_ARENA_MAX``; glibc's default is 8 per core).
ARENAS = "2"


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


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


def apply_memory_limit(environ: Mapping[str, str] | None = None) -> int | None:
    """Set this process's ``RLIMIT_AS`` soft limit to :data:`MEMORY_ENV` MiB (the hard limit stays, so
    :func:`lift_memory_limit` can lift it to report an overrun); returns the limit in bytes, ``None`` without one.

    Raises:
        ValueError: :data:`MEMORY_ENV` is not a positive integer.
    """
    text = (os.environ if environ is None else environ).get(MEMORY_ENV)
    if not text:
        return None
    megabytes = int(text)
    if megabytes <= 0:
        raise ValueError(f"{MEMORY_ENV} must be a positive number of MiB, not {text!r}")
    limit = megabytes * 1024 * 1024
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
