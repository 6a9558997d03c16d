"""``python tests/train/forkserver_probe.py``: start one process from the fork server a learner's producers come
from (:func:`labswarm.train.distributed.producers.unforked` sets its preload), print what that process found in
its plugin registries without looking a name up: ``{kind: loaded}`` as JSON."""

from __future__ import annotations

import json
import multiprocessing
import sys
from typing import Any

KINDS = ("BLOCKS", "TRANSFORMATIONS", "EXTRACTORS", "STORAGES")


def loaded(out: Any) -> None:
    """In the forked process: each registry's state as the fork server left it (nothing imported here)."""
    registry = sys.modules.get("labswarm.registry")
    out.put({kind: registry is not None and getattr(registry, kind)._loaded for kind in KINDS})


if __name__ == "__main__":
    from labswarm.pipeline.base import Block
    from labswarm.train.distributed.producers import unforked

    unforked(Block.from_spec({"name": "prefetch"}), {"labswarm.pipeline.blocks.batch"})
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()
    process = context.Process(target=loaded, args=(queue,))
    process.start()
    print(json.dumps(queue.get(timeout=120)))
    process.join(30)
