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

A single learner (a job of one learner, :mod:`labswarm.jobs.learner.entry`) runs the reporter's and output
threads too: it trains with :class:`UnforkedLoop`, the single process's loop hooks with the same producers.

A fork server is a fresh interpreter started once per learner (by ``exec``, not a fork of the learner), single
threaded; each producer is forked from it. It imports the learner's main module and the pipeline blocks' modules
first (``set_forkserver_preload``), and the plugin registries loaded (:mod:`labswarm.pipeline.warm`), so each
producer starts warm, as a forked one does.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable
from typing import Any

from labswarm.pipeline.base import Block
from labswarm.train.loop import LoopHooks

#: The modules of the producers' loop and of its loaded plugin registries, preloaded by the fork server.
PRODUCER_MODULES = ("labswarm.pipeline.producer", "labswarm.pipeline.warm")


def unforked(block: Block[Any], modules: Iterable[str] = ()) -> Block[Any]:
    """``block`` as a distributed learner runs it: a prefetch block with ``start_method: fork`` (the default)
    becomes ``forkserver``, the fork server preloading ``modules`` (the pipeline's blocks' modules) and the
    producers' own (:data:`PRODUCER_MODULES`); any other block, and a prefetch block that names ``spawn`` or
    ``forkserver``, is unchanged.

    Returns:
        The block to run (a new one when changed).
    """
    if block.name != "prefetch" or block.config.start_method != "fork":
        return block
    # "__main__" (multiprocessing's own default preload): each producer would import the learner's main module
    # again otherwise (measured at load ~20: 2.6 s a producer without, see the commit)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__",
                                                                      *sorted({*modules, *PRODUCER_MODULES})])
    return Block.from_spec({**block.spec(), "start_method": "forkserver"})


class UnforkedLoop(LoopHooks):
    """The single process's loop hooks (:class:`~labswarm.train.loop.LoopHooks`: its steps, its one validation)
    for a process that runs other threads: its pipelines' producers start from a fork server (:func:`unforked`,
    preloading the modules of the blocks seen so far). A training job's single learner trains with these
    (:mod:`labswarm.jobs.learner.entry`); the distributed learners' hooks derive from them."""

    def __init__(self) -> None:
        super().__init__()
        self._modules: set[str] = set()  # the pipeline blocks' modules, preloaded by the producers' fork server

    def pipeline_block(self, block: Block[Any]) -> Block[Any]:
        """``block`` with its producers started from a fork server, never by forking this process
        (:func:`unforked`)."""
        self._modules.add(type(block).__module__)
        return unforked(block, self._modules)
