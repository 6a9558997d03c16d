"""How a distributed learner's pipelines start their producer processes: from a fork server, never by forking
the learner.

A distributed learner runs threads besides the trainer's: gloo's and the job store client's, and a job learner's
reporter and output threads (:mod:`labswarm.jobs.learner`). A child forked from a process with other threads may
deadlock on a lock one of them held at the fork: only the forking thread exists in the child, the lock's holder
does not (POSIX ``fork``; Python 3.12 warns at such a fork for this reason, and 3.14 makes ``forkserver`` the
default start method on Linux). Seen on 2 loaded cores (a 2-learner ``allreduce`` job, about 1 run in 7): a rank's
validation producer still inside ``fork()`` 30 s later, its learner waiting for the producer's first batch, the
peer's all-reduce timing out after the collective timeout and the healthy job restarting as a second attempt
(``tests/jobs/test_distributed_jobs.py``).

A fork server is a fresh interpreter started once per learner (by ``exec``, not a fork of the learner), single
threaded; each producer is forked from it. It imports the learner's main module and the pipeline blocks' modules
first (``set_forkserver_preload``), so each producer starts warm, as a forked one does.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable
from typing import Any

from labswarm.pipeline.base import Block

#: The module of the producers' loop, preloaded by the fork server.
PRODUCER_MODULE = "labswarm.pipeline.producer"


def unforked(block: Block[Any], modules: Iterable[str] = ()) -> Block[Any]:
    """``block`` as a distributed learner runs it: a prefetch block with ``start_method: fork`` (the default)
    becomes ``forkserver``, the fork server preloading ``modules`` (the pipeline's blocks' modules) and the
    producers' own; any other block, and a prefetch block that names ``spawn`` or ``forkserver``, is unchanged.

    Returns:
        The block to run (a new one when changed).
    """
    if block.name != "prefetch" or block.config.start_method != "fork":
        return block
    # "__main__" (multiprocessing's own default preload): each producer would import the learner's main module
    # again otherwise (measured at load ~20: 2.6 s a producer without, see the commit)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__",
                                                                      *sorted({*modules, PRODUCER_MODULE})])
    return Block.from_spec({**block.spec(), "start_method": "forkserver"})
