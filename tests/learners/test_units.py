"""In-process checks of the learners' parts: the environment seam, the wire format, a shard's update rules."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from labswarm.errors import ConfigError
from labswarm.train.distributed import Framework, LearnerContext
from labswarm.train.distributed.cursor import GlobalCursor
from labswarm.train.distributed.launch import JobCoordinator, plan_attempt, restart_scope
from labswarm.train.distributed.ps.protocol import ProtocolError, recv, send
from labswarm.train.distributed.ps.server import Shard, ShardServer


def test_context_round_trips_through_the_environment() -> None:
    ctx = LearnerContext(rank=1, world_size=3, master_addr="10.0.0.1", master_port=29500, attempt=2,
                         ps_addresses=(("ps-0", 7000), ("ps-1", 7001)), timeout_s=12.5)
    assert LearnerContext.from_env(ctx.to_env()) == ctx
    assert LearnerContext.from_env({}) == LearnerContext()  # one learner: no rendezvous, no server


@pytest.mark.parametrize(("env", "field"), [({"RANK": "3", "WORLD_SIZE": "3"}, "RANK"),
                                            ({"WORLD_SIZE": "two"}, "WORLD_SIZE"),
                                            ({"LABSWARM_PS_ADDRS": "host-without-port"}, "LABSWARM_PS_ADDRS"),
                                            ({"LABSWARM_COLLECTIVE_TIMEOUT_S": "0"}, "LABSWARM_COLLECTIVE_TIMEOUT_S")])
def test_bad_environment_names_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        LearnerContext.from_env(env)
    assert info.value.errors[0][0] == field


def test_framework_parameters_are_validated_by_name() -> None:
    known = "known: allreduce, distributed_hogwild, downpour, easgd, model_averaging, sandblaster"
    with pytest.raises(ConfigError, match=known):
        Framework.from_spec({"name": "hogwild"})
    with pytest.raises(ConfigError, match="period"):
        Framework.from_spec({"name": "model_averaging", "period": 1})
    assert Framework.from_spec({"name": "easgd", "tau": 8}).config.tau == 8


def test_wire_format_round_trip_and_truncation() -> None:
    a, b = socket.socketpair()
    with a, b:
        tensors = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([1.5], dtype=torch.float64)]
        assert send(a, {"op": "push", "since": 4}, tensors) == 6 * 4 + 8
        header, arrays = recv(b)
        assert header == {"op": "push", "since": 4}
        assert [x.shape for x in arrays] == [(2, 3), (1,)] and arrays[0][1, 2] == 5 and arrays[1].dtype == np.float64
        a.sendall(b"\x00" * 7)
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ProtocolError, match="closed"):
            recv(b)


def _frame(header: dict, tensor_bytes: bytes = b"") -> bytes:
    import json
    import struct

    head = json.dumps(header).encode()
    return struct.pack(">Q", len(head)) + head + tensor_bytes


@pytest.mark.parametrize(("specs", "match"), [
    ([["<f4", [-2]]], "shape"),  # a negative dimension: was a ValueError from bytearray(-8)
    ([["|O", [1]]], "dtype"),  # object arrays cannot come from bytes: was a ValueError from np.frombuffer
    ([["<f4", ["x"]]], "shape"),
])
def test_a_malformed_tensor_spec_is_a_protocol_error(specs: list, match: str) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(_frame({"op": "push", "tensors": specs}, b"\x00" * 8))
        with pytest.raises(ProtocolError, match=match):
            recv(b)


def test_a_declared_size_is_not_allocated_before_its_bytes_arrive() -> None:
    """A stray peer declaring a 4-TiB tensor and sending 16 bytes: 'closed', not a MemoryError (was: the whole
    declared size allocated up front)."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(_frame({"op": "push", "tensors": [["<f4", [2**40]]]}, b"\x00" * 16))
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ProtocolError, match="closed"):
            recv(b)


def test_a_shard_server_closes_a_connection_that_sends_a_malformed_frame(tmp_path: Path) -> None:
    server = ShardServer(shard(tmp_path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as bad:
            assert recv(bad)[0] == {"nonce": None}  # the handshake's hello: a shard without a secret
            bad.sendall(_frame({"op": "pull", "tensors": [["<f4", [-1]]]}))
            assert bad.recv(1) == b""  # closed by the shard, no reply
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as good:
            recv(good)
            send(good, {"op": "pull"})
            header, arrays = recv(good)
            assert header["version"] == 0 and arrays[0].tolist() == [1.0, 1.0, 1.0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def shard(tmp_path: Path, learners: int = 1, **kwargs: object) -> Shard:
    s = Shard(0, learners, tmp_path, **kwargs)
    s.handle({"op": "init", "names": ["w"], "optimizer": {"kind": "SGD", "defaults": {"lr": 0.5}}},
             [np.ones(3, dtype=np.float32)])
    return s


def test_shard_rules_and_resume_from_checkpoint(tmp_path: Path) -> None:
    s = shard(tmp_path, checkpoint_every=2)
    reply, _ = s.handle({"op": "push", "since": 0}, [np.full(3, 2.0, dtype=np.float32)])  # w = 1 - 0.5 * 2
    assert reply == {"version": 1, "staleness": 0}
    reply, _ = s.handle({"op": "push", "since": 0}, [np.zeros(3, dtype=np.float32)])
    assert reply["staleness"] == 1  # one update since this learner's pull
    _, diffs = s.handle({"op": "elastic", "alpha": 0.25}, [np.full(3, 4.0, dtype=np.float32)])
    np.testing.assert_allclose(diffs[0], 0.25 * (4.0 - 0.0))  # center moves by alpha (x - center)
    np.testing.assert_allclose(s.params[0].numpy(), 1.0)
    s.handle({"op": "init", "names": ["w"], "optimizer": None}, [np.full(3, 9.0, dtype=np.float32)])
    np.testing.assert_allclose(s.params[0].numpy(), 1.0)  # a later init keeps the shard's parameters
    s.handle({"op": "push", "since": 3}, [np.ones(3, dtype=np.float32)])  # version 4: checkpointed
    resumed = Shard(0, 1, tmp_path)
    assert resumed.version == 4
    np.testing.assert_allclose(resumed.params[0].numpy(), 0.5)
    assert resumed.optimizer is not None and resumed.optimizer.defaults["lr"] == 0.5


def test_a_synchronous_round_waits_for_every_learner_and_times_out(tmp_path: Path) -> None:
    s = shard(tmp_path, learners=2, round_timeout_s=30)
    replies: list = []
    t = threading.Thread(target=lambda: replies.append(s.handle({"op": "push_sync"}, [np.full(3, 2.0, "f4")])))
    t.start()
    reply, params = s.handle({"op": "push_sync"}, [np.zeros(3, dtype=np.float32)])
    t.join(10)
    assert reply["version"] == 1 and replies[0][0]["version"] == 1
    np.testing.assert_allclose(params[0].numpy(), 1.0 - 0.5 * 1.0)  # the mean gradient, 1.0, applied once
    s.round_timeout_s = 0.1
    with pytest.raises(ValueError, match="1 learner"):
        s.handle({"op": "push_sync"}, [np.zeros(3, dtype=np.float32)])
    assert s.version == 1


def test_an_attempt_plan_starts_the_shards_first_then_the_learners(tmp_path: Path) -> None:
    plan = plan_attempt({"name": "downpour", "n_fetch": 2}, 2, 3, ("10.0.0.1", 29500),
                        [("10.0.0.2", 7000), ("10.0.0.3", 7001)], tmp_path, timeout_s=9)
    assert [(p.kind, p.index) for p in plan] == [("ps", 0), ("ps", 1), ("learner", 0), ("learner", 1)]
    assert plan[1].argv[plan[1].argv.index("--port") + 1] == "7001"
    ctx = LearnerContext.from_env(plan[3].env)
    assert (ctx.rank, ctx.world_size, ctx.attempt, ctx.master_port, ctx.timeout_s) == (1, 2, 3, 29500, 9)
    assert ctx.ps_addresses == (("10.0.0.2", 7000), ("10.0.0.3", 7001))
    assert [p.kind for p in plan_attempt({"name": "allreduce"}, 2, 1, ("h", 1))] == ["learner", "learner"]
    assert (restart_scope({"name": "allreduce"}), restart_scope({"name": "easgd"})) == ("attempt", "learner")
    with pytest.raises(ConfigError) as info:
        plan_attempt({"name": "sandblaster"}, 2, 1, ("h", 1))
    assert info.value.errors[0][0] == "ps_shards"


def test_an_attempt_plan_takes_the_frameworks_timeout(tmp_path: Path) -> None:
    plan = plan_attempt({"name": "easgd", "timeout_s": 4.5}, 2, 1, ("h", 1), [("h", 7000)], tmp_path)
    [shard, *learners] = plan
    assert shard.argv[shard.argv.index("--round-timeout") + 1] == "4.5"
    assert {LearnerContext.from_env(p.env).timeout_s for p in learners} == {4.5}
    assert LearnerContext.from_env(plan_attempt({"name": "allreduce"}, 2, 1, ("h", 1))[0].env).timeout_s == 30
    for bad in (0, -1, 3601, "soon"):
        with pytest.raises(ConfigError) as info:
            plan_attempt({"name": "allreduce", "timeout_s": bad}, 2, 1, ("h", 1))
        assert "timeout_s" in str(info.value), bad


def test_the_coordinator_checkpoints_and_restores_the_cursor() -> None:
    first = JobCoordinator()
    cursor = GlobalCursor(first.store, 10, 3, owner="0")
    assert cursor.done(cursor.claim(0))
    state = first.cursor_state(10, 3, 0)
    second = JobCoordinator()
    second.restore_cursor(state)
    assert GlobalCursor(second.store, 10, 3, owner="x").chunk_states(0) == ["D|0", "", "", ""]


def test_downpour_pushes_the_gradients_left_at_the_end(tmp_path: Path) -> None:
    """n_push 4 and 6 steps: the server gets the 6 steps' gradients, not the first 4 alone (was: the last 2
    steps' sum left in the learner and the model replaced by the server's at finish). A real shard over TCP."""
    server = ShardServer(Shard(0, 1, tmp_path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        framework = Framework.from_spec({"name": "downpour", "n_push": 4, "n_fetch": 100})
        module = framework.attach(model, optimizer, LearnerContext(ps_addresses=(("127.0.0.1", server.port),)))
        for _ in range(6):
            optimizer.zero_grad()
            (-module(torch.ones(1, 1))).sum().backward()  # gradient -1 on the weight, every step
            optimizer.step()
        framework.finish()
        framework.close()
        assert model.weight.item() == pytest.approx(0.6)  # the server applied 4 + 2 = 6 times lr 0.1 x 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
