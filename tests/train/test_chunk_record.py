"""The chunk record (labswarm.train.distributed.record) and the cursor state a lockstep checkpoint holds."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from labswarm.train.distributed.context import LearnerContext
from labswarm.train.distributed.cursor import GlobalCursor
from labswarm.train.distributed.record import ChunkRecord, counted, read
from labswarm.train.distributed.training import DistributedTraining


def test_lines_survive_a_sigkill_and_a_restart_appends(tmp_path: Path) -> None:
    path = tmp_path / "w" / "chunks.jsonl"
    # a process writes two lines and is killed -9 before it closes anything: both are in the file
    code = ("import os, signal, sys\nfrom pathlib import Path\n"
            "from labswarm.train.distributed.record import ChunkRecord\n"
            "r = ChunkRecord(Path(sys.argv[1]), '1:1:100')\n"
            "r.trained(0, 3, ['x', 'y']); r.trained(0, 5, ['z'])\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    assert subprocess.run([sys.executable, "-c", code, str(path)], check=False).returncode == -signal.SIGKILL
    with ChunkRecord(path, "1:1:200") as again:  # its successor appends
        again.trained(0, 7, ["w"])
        again.trained(1, 0, ["x"])
        again.lost(1, 0)
    lines = read([path, tmp_path / "absent.jsonl"])
    assert [(x["chunk"], x["owner"]) for x in lines] == [(3, "1:1:100"), (5, "1:1:100"), (7, "1:1:200"),
                                                          (0, "1:1:200"), (0, "1:1:200")]
    assert [x["chunk"] for x in counted(lines)] == [3, 5, 7]  # the lost chunk does not count
    # against the cursor: only the owner it marked done counts (chunk 5 was trained again by someone else)
    cursor = {0: ["", "", "", "D|1:1:100", "", "D|0:1:300", "", "D|1:1:200"]}
    assert [x["chunk"] for x in counted(lines, cursor)] == [3, 7]


def test_a_lockstep_checkpoint_frees_a_peers_claim_on_the_next_pass() -> None:
    # at an epoch's end rank 0 reads the cursor while a peer has already claimed its first chunk of the next
    # pass: kept as a lease, a restart from the checkpoint would never train that chunk (claim_fresh skips it)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    peer = GlobalCursor(store, 8, 2, owner="1:1:2")
    for _ in range(2):
        chunk = peer.claim_fresh(0)
        assert chunk is not None and peer.done(chunk)
    claimed = peer.claim_fresh(1)  # the next pass's first chunk
    assert claimed is not None
    learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=2))
    learner.cursor = GlobalCursor(store, 8, 2, owner="0:1:1")
    passes = learner.state_dict()["cursor"]["passes"]
    assert passes[1][claimed.index] == ""  # free again
    assert sorted(v for v in passes[0] if v) == ["D|1:1:2", "D|1:1:2"]
