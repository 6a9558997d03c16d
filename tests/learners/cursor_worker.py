"""A learner program for the cursor tests: claims chunks of each pass and records the samples it trained.

``python tests/learners/cursor_worker.py SPEC_JSON`` with RANK / MASTER_ADDR / MASTER_PORT in the environment.
SPEC: ``n_samples``, ``chunk_size``, ``lease_s``, ``passes``, ``out`` (folder: ``rank-<r>.jsonl`` gets one
line ``{"pass", "chunk", "samples"}`` per chunk marked done), ``hold`` (this rank, after that many done chunks,
claims one more, sets the store key ``holding`` and blocks: the test kills it there), ``wait_go`` (start only
once the store key ``go`` is set).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from labswarm.train.distributed.cursor import GlobalCursor


def main() -> None:
    spec = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=timedelta(seconds=60))
    cursor = GlobalCursor(store, spec["n_samples"], spec["chunk_size"], owner=f"{rank}:{os.getpid()}",
                          lease_s=spec["lease_s"])
    if spec.get("wait_go"):
        store.wait(["go"])
    hold = spec.get("hold", {}).get(str(rank))
    done = 0
    with open(Path(spec["out"]) / f"rank-{rank}.jsonl", "a") as out:
        for pass_ in range(spec["passes"]):
            while (chunk := cursor.claim(pass_, timeout_s=60)) is not None:
                if hold is not None and done == hold:
                    store.set("holding", f"{chunk.pass_}/{chunk.index}")
                    store.wait(["never"], timedelta(seconds=120))  # killed here
                # "train" on the chunk's samples, then mark it done and record it only if the mark counted
                if cursor.done(chunk):
                    out.write(json.dumps({"pass": pass_, "chunk": chunk.index,
                                          "samples": chunk.samples.tolist()}) + "\n")
                    out.flush()
                    done += 1


if __name__ == "__main__":
    main()
