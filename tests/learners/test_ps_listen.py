"""A parameter-server shard's process holds its port before it imports torch (a real shard process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_until

from labswarm.train.distributed.ps.auth import client_handshake
from labswarm.train.distributed.ps.protocol import recv, send

#: Run as ``python -c``: when the shard's ``import torch`` starts, write the port of every socket of the process that
#: listens (SO_ACCEPTCONN) to ``argv[1]``, then hold the import until ``argv[2]`` exists (a shard still loading torch,
#: as long as the test needs); then the shard's own command, with the rest of argv.
HOOKED_SHARD = textwrap.dedent("""
    import gc, os, runpy, socket, sys, time
    report, go = sys.argv[1], sys.argv[2]

    class AtTorch:
        fired = False
        def find_spec(self, name, path=None, target=None):
            if name == "torch" and not AtTorch.fired:
                AtTorch.fired = True
                ports = [s.getsockname()[1] for s in gc.get_objects() if isinstance(s, socket.socket)
                         and s.fileno() >= 0 and s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)]
                with open(report + ".tmp", "w") as f:
                    f.write(" ".join(map(str, ports)))
                os.replace(report + ".tmp", report)
                deadline = time.monotonic() + 300
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.05)
            return None

    sys.meta_path.insert(0, AtTorch())
    sys.argv = ["labswarm.train.distributed.ps", *sys.argv[3:]]
    runpy.run_module("labswarm.train.distributed.ps", run_name="__main__", alter_sys=True)
""")


@pytest.mark.slow  # a real shard's process importing torch: 10 s measured at load ~5
def test_a_shard_listens_before_it_imports_torch_and_serves_a_learner_that_connected_meanwhile(
        tmp_path: Path) -> None:
    report, go, ready = tmp_path / "at-torch", tmp_path / "go", tmp_path / "shard.port"
    env = {k: v for k, v in os.environ.items() if k != "LABSWARM_PS_SECRET"}
    argv = ["--shard", "0", "--learners", "1", "--checkpoint-dir", str(tmp_path / "ps")]
    with open(tmp_path / "shard.log", "wb") as out:
        shard = subprocess.Popen([sys.executable, "-c", HOOKED_SHARD, str(report), str(go), *argv,
                                  "--ready-file", str(ready)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: report.exists() or shard.poll() is not None, "the shard to import torch", 120)
        assert report.exists(), (tmp_path / "shard.log").read_text()
        listening = [int(p) for p in report.read_text().split()]
        assert len(listening) == 1 and listening[0] > 0, f"listening sockets when torch was imported: {listening}"
        port = listening[0]
        assert not ready.exists()  # the ready file says it serves: not before torch and the checkpoint are loaded
        # a learner connecting while the shard loads is queued, not refused
        early = socket.create_connection(("127.0.0.1", port), timeout=120)
        # a second shard on the same port (a revival whose port is held) fails at once, before torch, saying why
        taken = subprocess.run([sys.executable, "-m", "labswarm.train.distributed.ps", *argv, "--port", str(port)],
                               capture_output=True, text=True, env=env, timeout=120)
        assert taken.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr, taken.stderr
        go.touch()
        with early:
            client_handshake(early, None, "shard 0")
            send(early, {"op": "init", "names": ["w"], "optimizer": {"kind": "SGD", "defaults": {"lr": 0.5}}},
                 [np.ones(3, dtype=np.float32)])
            assert recv(early) == ({"version": 0}, [])
            send(early, {"op": "pull"}, [])
            reply, arrays = recv(early)
            assert reply == {"version": 0} and np.array_equal(arrays[0], np.ones(3, dtype=np.float32))
        wait_until(ready.exists, "the shard's ready file", 120)
        assert int(ready.read_text()) == port
    finally:
        go.touch()
        if shard.poll() is None:
            shard.send_signal(signal.SIGTERM)
        shard.wait(timeout=60)
