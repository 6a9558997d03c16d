"""Python's cyclic garbage collector paused while a process builds what it keeps for good (imports, a warm-up),
the one way labswarm's processes do it (``labswarm worker``, ``labswarm run``'s manager start; the workers' warm
parent, :mod:`labswarm.cli.standby`, freezes without the collection first)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """The cyclic collector off inside the block, then on again if it was on before.

    Why: the objects that imports and a warm-up create (classes, schemas, the audio libraries' ~250k objects) live
    as long as the process, yet each automatic collection while they are made walks all of them again (issue 27,
    a loaded 2-core machine: ``labswarm worker``'s start 2.8 s of CPU instead of 3.2 s; ``labswarm run``'s manager
    start, 3 alternating pairs, 0.78-0.81 s instead of 0.96-1.15 s, on the run's critical path).

    Args:
        freeze: when the block ends without an error, collect its garbage once (frozen, it would never be freed),
            then :func:`gc.freeze` every object left: CPython's advice for a process that forks without exec
            (the documentation of ``gc.freeze``: disable the collector early in the parent, freeze just before
            the fork, enable it in the children) so that the pool processes' collections do not touch, and so
            copy on write, the pages of the parent's objects; the interpreter's collections at exit skip them too.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if freeze:
            gc.collect()
            gc.freeze()
    finally:
        if enabled:
            gc.enable()
