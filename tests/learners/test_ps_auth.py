"""The parameter-server shards' per-job secret: the handshake, the loopback rule, and how the secret travels."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from labswarm.errors import ConfigError
from labswarm.train.distributed.launch import plan_attempt
from labswarm.train.distributed.ps import ParameterServerClient, ParameterServerError
from labswarm.train.distributed.ps.auth import SECRET_ENV, check_bind, new_secret
from labswarm.train.distributed.ps.protocol import recv, send
from labswarm.train.distributed.ps.server import Shard, ShardServer

SECRET = new_secret()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[ShardServer]:
    """A shard holding ``w = [1, 1, 1]``, served on loopback with :data:`SECRET`."""
    shard = Shard(0, 1, tmp_path)
    shard.handle({"op": "init", "names": ["w"], "optimizer": {"kind": "SGD", "defaults": {"lr": 0.5}}},
                 [np.ones(3, dtype=np.float32)])
    server = ShardServer(shard, secret=SECRET)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def client(port: int, secret: str | None) -> ParameterServerClient:
    # a long timeout: an authentication failure must raise at once, not be retried until it passes
    return ParameterServerClient([("127.0.0.1", port)], ["w"], [3], timeout_s=120, secret=secret)


def test_the_right_secret_is_answered(secured: ShardServer) -> None:
    c = client(secured.port, SECRET)
    try:
        assert c.pull()[0].tolist() == [1.0, 1.0, 1.0]
        c.push([np.ones(3, dtype=np.float32)])
        assert c.pull()[0].tolist() == [0.5, 0.5, 0.5]  # one SGD step of lr 0.5, on the same connection
    finally:
        c.close()


@pytest.mark.parametrize(("secret", "reason"), [(new_secret(), "refused this learner: authentication failed"),
                                                (None, f"asks for the job's secret and {SECRET_ENV} is not set")],
                         ids=["wrong", "missing"])
def test_a_wrong_or_missing_secret_is_refused_at_once(secured: ShardServer, secret: str | None, reason: str) -> None:
    c = client(secured.port, secret)
    try:
        with pytest.raises(ParameterServerError, match=reason):  # "unreachable for 120 s" if it were retried
            c.pull()
    finally:
        c.close()
    assert secured.shard.version == 0


def test_a_forged_answer_gets_an_error_and_the_connection_closed(secured: ShardServer) -> None:
    with socket.create_connection(("127.0.0.1", secured.port), timeout=10) as sock:
        assert len(recv(sock)[0]["nonce"]) == 64
        send(sock, {"op": "auth", "mac": "0" * 64, "nonce": "00"})
        assert "authentication failed" in recv(sock)[0]["error"]
        assert sock.recv(1) == b""  # closed by the shard
    with socket.create_connection(("127.0.0.1", secured.port), timeout=10) as sock:
        recv(sock)
        send(sock, {"op": "pull"})  # a request instead of the answer
        assert "error" in recv(sock)[0] and sock.recv(1) == b""


def test_a_learner_with_the_secret_refuses_a_shard_without_one(tmp_path: Path) -> None:
    server = ShardServer(Shard(0, 1, tmp_path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    c = client(server.port, SECRET)
    try:
        with pytest.raises(ParameterServerError, match="has no secret"):
            c.pull()
    finally:
        c.close()
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_without_a_secret_a_shard_listens_on_loopback_only(tmp_path: Path) -> None:
    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    with pytest.raises(ConfigError) as info:
        ShardServer(Shard(0, 1, tmp_path), "0.0.0.0")
    assert info.value.errors[0][0] == "host" and SECRET_ENV in info.value.errors[0][1]
    ShardServer(Shard(0, 1, tmp_path), "0.0.0.0", secret=SECRET).server_close()
    # the shard's command refuses before it imports torch
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run([sys.executable, "-m", "labswarm.train.distributed.ps", "--shard", "0", "--learners", "2",
                           "--checkpoint-dir", str(tmp_path), "--host", "0.0.0.0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and SECRET_ENV in done.stderr, done.stderr


def test_the_plan_carries_the_secret_in_environments_only(tmp_path: Path) -> None:
    plans = plan_attempt({"name": "downpour"}, 2, 1, ("h", 1), [("h", 2), ("h", 3)], tmp_path, ps_secret=SECRET)
    assert [p.env.get(SECRET_ENV) for p in plans] == [SECRET] * 4  # 2 shards, 2 learners
    assert not any(SECRET in arg for p in plans for arg in p.argv or [])
    plans = plan_attempt({"name": "allreduce"}, 2, 1, ("h", 1), ps_secret=SECRET)
    assert not any(SECRET_ENV in p.env for p in plans)  # no server, no secret
    assert not any(SECRET_ENV in p.env for p in plan_attempt({"name": "easgd"}, 2, 1, ("h", 1), [("h", 2)],
                                                             tmp_path))


@pytest.mark.slow  # one real shard process (imports torch: 4-7 s on the 2 shared cores)
def test_a_jobs_shard_gets_the_secret_by_environment_and_keeps_it_across_attempts(tmp_path: Path) -> None:
    from labswarm.jobs.lifecycle.cluster import JobCluster

    cluster = JobCluster("job1", tmp_path, {"name": "downpour"}, 2, 1)
    try:
        first = cluster.new_attempt(1, None)
        secret = first[0].env[SECRET_ENV]
        assert len(secret) == 64 and {p.env[SECRET_ENV] for p in first} == {secret}
        (pid,) = cluster.shard_pids
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert not any(secret.encode() in arg for arg in argv)  # ps shows command lines to every user
        assert f"{SECRET_ENV}={secret}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        second = cluster.new_attempt(2, None)  # a new attempt keeps the running shard, so the same secret
        assert cluster.shard_pids == [pid] and {p.env[SECRET_ENV] for p in second} == {secret}
        ((host, port),) = cluster.ps_addresses
        right = ParameterServerClient([(host, port)], ["w"], [3], timeout_s=60, secret=secret)
        wrong = ParameterServerClient([(host, port)], ["w"], [3], timeout_s=60, secret=new_secret())
        try:
            right.init([np.ones(3, dtype=np.float32)], {"kind": "SGD", "defaults": {"lr": 0.1}})
            assert right.pull()[0].tolist() == [1.0, 1.0, 1.0]
            with pytest.raises(ParameterServerError, match="authentication failed"):
                wrong.pull()
        finally:
            right.close()
            wrong.close()
    finally:
        cluster.close()
    assert JobCluster("job2", tmp_path / "2", {"name": "downpour"}, 2, 1)._ps_secret != secret  # one per job
