"""A parameter-server shard: holds its share of a job's parameters and applies the learners' updates.

One shard per process (``python -m labswarm.train.distributed.ps``), ``ps_shards`` of them per job, deployed by the
lifecycle before the learners; each parameter lives on exactly one shard (the client assigns them). Operations
(the header's ``op``; tensors in the order of the header's ``names``):

- ``init``: the first learner's parameters and optimizer (``{kind, defaults}``) become the shard's, unless it
  already has some (a checkpoint, or a learner before it). Every learner then ``pull``\\ s the same start.
- ``pull``: the shard's parameters and its ``version`` (updates applied so far).
- ``push``: gradients, applied at once with the shard's optimizer (Downpour); the reply carries the version and
  the staleness (updates since the learner's ``since`` version).
- ``push_sync``: gradients of one synchronous round (Sandblaster): the shard waits for all ``learners``, applies
  their mean, and answers each with the new parameters. A round a learner never joins times out.
- ``elastic``: a learner's parameters ``x`` for elastic averaging (EASGD): ``d = alpha (x - center)``,
  ``center += d``, the reply is ``d`` (the learner subtracts it).

Checkpoints: every ``checkpoint_every`` updates the shard writes ``shard-<k>.pt`` (parameters, optimizer
state, version) atomically; a restarted shard loads it and goes on from that version (the updates after it are
lost: an asynchronous framework tolerates that, a synchronous one restarts from the job's checkpoint).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import socketserver
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from labswarm.train.distributed.ps.auth import LISTEN_BACKLOG, listen, server_handshake
from labswarm.train.distributed.ps.protocol import ProtocolError, recv, send

log = logging.getLogger(__name__)

#: The optimizers a shard can run, by class name (the learner's optimizer class).
OPTIMIZERS = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}


class Shard:
    """The state and update rules of one shard; thread-safe (one lock; a synchronous round waits on it).

    Args:
        index: the shard's index, from 0.
        learners: learners in the job (the size of a synchronous round).
        checkpoint_dir: where ``shard-<index>.pt`` is written and, at start, read back from.
        checkpoint_every: updates between two checkpoints (1: after every update).
        round_timeout_s: how long a synchronous round waits for the missing learners, in s.
    """

    def __init__(self, index: int, learners: int, checkpoint_dir: Path, checkpoint_every: int = 10,
                 round_timeout_s: float = 30.0) -> None:
        self.index, self.learners = index, learners
        self.path = Path(checkpoint_dir) / f"shard-{index}.pt"
        self.checkpoint_every, self.round_timeout_s = checkpoint_every, round_timeout_s
        self.names: list[str] = []
        self.params: list[torch.Tensor] = []
        self.optimizer: Any = None
        self.optimizer_spec: dict[str, Any] | None = None
        self.version = 0
        self._cond = threading.Condition()
        self._round: list[list[np.ndarray]] = []
        self._round_no = 0
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        state = torch.load(self.path, weights_only=True)
        self._set(state["names"], state["params"], state["optimizer_spec"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        log.info("shard %d resumed from %s at version %d", self.index, self.path, self.version)

    def _set(self, names: list[str], params: list[Any], spec: dict[str, Any] | None) -> None:
        self.names = list(names)
        self.params = [torch.as_tensor(np.array(p)).clone() if not torch.is_tensor(p) else p.clone() for p in params]
        self.optimizer_spec = spec
        self.optimizer = None
        if spec is not None:
            cls = OPTIMIZERS.get(spec["kind"])
            if cls is None:
                raise ValueError(f"optimizer {spec['kind']!r} is not supported; known: {', '.join(OPTIMIZERS)}")
            accepted = inspect.signature(cls).parameters  # AdamW's defaults name keys its constructor refuses
            self.optimizer = cls(self.params, **{k: v for k, v in spec["defaults"].items() if k in accepted})

    def checkpoint(self) -> None:
        """Write the shard's state atomically (a temporary file renamed over the last checkpoint)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"names": self.names, "params": self.params, "version": self.version,
                    "optimizer_spec": self.optimizer_spec,
                    "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None}, tmp)
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Checkpoint what the shard holds (at shutdown)."""
        with self._cond:
            if self.params:
                self.checkpoint()

    def _updated(self) -> None:
        self.version += 1
        if self.version % self.checkpoint_every == 0:
            self.checkpoint()

    def _apply(self, grads: list[np.ndarray]) -> None:
        if self.optimizer is None:
            raise ValueError("this shard has no optimizer: the learners' init named none")
        for p, g in zip(self.params, grads, strict=True):
            p.grad = torch.from_numpy(g).reshape(p.shape)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._updated()

    def handle(self, header: dict[str, Any], arrays: list[np.ndarray]) -> tuple[dict[str, Any], list[Any]]:
        """One request; returns the reply ``(header, tensors)``.

        Raises:
            ValueError: an unknown operation, a shard without parameters, or a synchronous round timed out.
        """
        op = header.get("op")
        with self._cond:
            if op == "init":
                if not self.params:
                    self._set(header["names"], arrays, header.get("optimizer"))
                    self.checkpoint()
                return {"version": self.version}, []
            if not self.params:
                raise ValueError("the shard has no parameters yet: a learner must send init first")
            if op == "pull":
                return {"version": self.version}, self.params
            if op == "push":
                staleness = self.version - int(header["since"])
                self._apply(arrays)
                return {"version": self.version, "staleness": staleness}, []
            if op == "push_sync":
                return self._push_sync(arrays)
            if op == "elastic":
                alpha = float(header["alpha"])
                diffs = [alpha * (torch.from_numpy(x) - c) for x, c in zip(arrays, self.params, strict=True)]
                for c, d in zip(self.params, diffs, strict=True):
                    c.add_(d)
                self._updated()
                return {"version": self.version}, diffs
        raise ValueError(f"unknown operation {op!r}")

    def _push_sync(self, grads: list[np.ndarray]) -> tuple[dict[str, Any], list[Any]]:
        """Join the current synchronous round (the lock is held); the last learner in applies the mean."""
        round_no = self._round_no
        self._round.append(grads)
        if len(self._round) == self.learners:
            mean = [np.mean(np.stack(gs), axis=0) for gs in zip(*self._round, strict=True)]
            self._round, self._round_no = [], round_no + 1
            self._apply(mean)
            self._cond.notify_all()
        elif not self._cond.wait_for(lambda: self._round_no > round_no, self.round_timeout_s):
            missing = self.learners - len(self._round)
            self._round = []  # the round is void: its learners restart together from a checkpoint
            raise ValueError(f"synchronous round {round_no} timed out after {self.round_timeout_s} s: "
                             f"{missing} learner(s) missing")
        return {"version": self.version}, [p.detach().clone() for p in self.params]


class _Handler(socketserver.BaseRequestHandler):
    """One learner connection: the handshake (:mod:`labswarm.train.distributed.ps.auth`), then requests answered in
    order until it closes."""

    def handle(self) -> None:
        shard: Shard = self.server.shard  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not server_handshake(sock, self.server.secret):  # type: ignore[attr-defined]
                log.warning("shard %d refused a connection from %s: wrong secret", shard.index, self.client_address)
                return
        except (ProtocolError, OSError):
            return
        while True:
            try:
                header, arrays = recv(sock)
            except (ProtocolError, OSError):
                return
            try:
                reply, tensors = shard.handle(header, arrays)
            except (ValueError, KeyError, TypeError, RuntimeError) as exc:  # the learner's error, reported back to it
                reply, tensors = {"error": f"{type(exc).__name__}: {exc}"}, []
            try:
                send(sock, reply, tensors)
            except OSError:
                return


class ShardServer(socketserver.ThreadingTCPServer):
    """A TCP server around a :class:`Shard` (a thread per learner connection); every connection starts with the
    handshake of :mod:`labswarm.train.distributed.ps.auth`.

    Args:
        shard: the shard.
        host: the address to listen on.
        port: the port; 0 picks a free one (read :attr:`port`). A restarted shard takes its old port back.
        secret: the job's secret (learners must prove it); ``None``: any learner is answered, and ``host`` must be
            loopback.
        sock: a socket already listening on ``host:port`` (:func:`~labswarm.train.distributed.ps.auth.listen`), which
            the server takes over: the shard's process binds it before it imports torch, so no other process can
            take the port in those seconds; ``None``: bound here.

    Raises:
        ConfigError: ``host`` is not loopback and there is no secret.
        OSError: the address cannot be bound.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, shard: Shard, host: str = "127.0.0.1", port: int = 0, secret: str | None = None,
                 sock: socket.socket | None = None) -> None:
        sock = sock if sock is not None else listen(host, port, secret)
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()  # the one TCPServer made, never bound
        self.socket = sock
        self.server_address = sock.getsockname()
        self.shard = shard
        self.secret = secret or None

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self.server_address[1])
