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
producer starts warm, as a forked one does. Starting it (an interpreter importing the learner's modules, torch
among them) takes seconds: :class:`UnforkedLoop` starts it in a thread when training starts
(:func:`start_fork_server`), while the learner reads its training features, rather than when the first
validation asks for its producers (a one-learner job's first epoch ended ~9 s later than before it had a fork
server, issue 23); only if a prefetch block has producers to fork (``producers: 0``, as compare's one-learner runs
set it, starts no fork server).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from labswarm.pipeline.base import Block
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train.loop import LoopHooks

log = logging.getLogger(__name__)

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


def start_fork_server() -> threading.Thread:
    """Start the fork server :func:`unforked` set up (its preload as set so far), in a daemon thread, so that its
    start overlaps whatever this process does next; the first producer then finds it running. The fork server
    and multiprocessing's resource tracker are started by ``exec`` (``spawnv_passfds``), never by forking this
    process, under the fork server's own lock: a producer started meanwhile waits for the same server. A failure
    is logged; the first producer's start then tries again and raises it.

    Returns:
        The thread (joined by nobody; ``join()`` it to wait for the server).
    """
    from multiprocessing import forkserver

    def run() -> None:
        try:
            forkserver.ensure_running()
        except Exception as exc:  # the first producer's start tries again and reports it
            log.warning("the producers' fork server did not start ahead: %s", exc)

    thread = threading.Thread(target=run, name="fork-server-start", daemon=True)
    thread.start()
    return thread


class UnforkedLoop(LoopHooks):
    """The single process's loop hooks (:class:`~labswarm.train.loop.LoopHooks`: its steps, its one validation)
    for a process that runs other threads: its pipelines' producers start from a fork server (:func:`unforked`,
    preloading the modules of the blocks seen so far). A training job's single learner trains with these
    (:mod:`labswarm.jobs.learner.entry`); the distributed learners' hooks derive from them."""

    def __init__(self) -> None:
        super().__init__()
        self._modules: set[str] = set()  # the pipeline blocks' modules, preloaded by the producers' fork server
        #: A block seen so far starts producer processes from the fork server (a prefetch block with ``producers``
        #: above 0); ``False``: none will (``producers: 0``, compare's one-learner runs), no fork server starts.
        self.forks = False

    def pipeline_block(self, block: Block[Any]) -> Block[Any]:
        """``block`` with its producers started from a fork server, never by forking this process
        (:func:`unforked`); one that will start producers from it sets :attr:`forks`."""
        self._modules.add(type(block).__module__)
        block = unforked(block, self._modules)
        if block.name == "prefetch" and block.config.start_method == "forkserver" and block.config.producers > 0:
            self.forks = True
        return block

    def start_fork_server(self) -> threading.Thread | None:
        """Start the producers' fork server ahead (:func:`start_fork_server`) if a pipeline block will fork
        producers from it (:attr:`forks`): with ``producers: 0`` no interpreter is started (none would be used).

        Returns:
            The starting thread, or ``None`` when no fork server is needed.
        """
        return start_fork_server() if self.forks else None

    def attach(self, torch: Any, model: Any, optimizer: Any, train: Pipeline, output: str, run_dir: Path) -> Any:
        """Training starts (:meth:`LoopHooks.attach`): the fork server starts meanwhile, in a thread, if producers
        will be forked from it (:meth:`start_fork_server`: the trainer built its pipelines, so the preload is set).

        Returns:
            ``model``.
        """
        self.start_fork_server()
        return super().attach(torch, model, optimizer, train, output, run_dir)
