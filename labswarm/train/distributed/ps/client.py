"""The learners' side of the parameter server: push gradients, pull parameters, elastic exchange.

:class:`ParameterServerClient` is the interface the frameworks use; it alone knows the shards' addresses and
the transport (:mod:`labswarm.train.distributed.ps.protocol`), so another transport can replace it. Parameters are
sharded by parameter: each named parameter lives on one shard, assigned greedily by size (largest first, to the
least loaded shard) so every learner computes the same assignment from the same model.

A shard that goes away (killed, restarting from its checkpoint) is waited for: each request is retried on a
new connection until ``timeout_s`` passes, then :class:`ParameterServerError` is raised. A push whose reply was
lost may thus be applied twice (at least once): asynchronous frameworks tolerate it; synchronous ones restart
from the job's checkpoint after a shard failure anyway. Every new connection starts with the handshake of
:mod:`labswarm.train.distributed.ps.auth`; a failed one (a wrong or missing secret) raises at once, never retried.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from labswarm.errors import LabswarmError
from labswarm.train.distributed.ps.auth import AuthError, client_handshake
from labswarm.train.distributed.ps.protocol import recv, send


class ParameterServerError(LabswarmError):
    """A shard could not be reached within the timeout, refused a request or this learner's secret (its reason in
    the message)."""


def assign_shards(sizes: Mapping[str, int], n_shards: int) -> dict[str, int]:
    """Which shard holds each parameter: largest first, each to the shard holding the fewest elements so far
    (ties: the lower index; equal sizes keep their order).

    Args:
        sizes: element count of each named parameter.
        n_shards: how many shards.

    Returns:
        ``{name: shard index}``.
    """
    load = [0] * n_shards
    out = {}
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        shard = min(range(n_shards), key=lambda s: (load[s], s))
        out[name] = shard
        load[shard] += sizes[name]
    return out


class ParameterServerClient:
    """One learner's connections to the shards of its job.

    Args:
        addresses: the shards as ``(host, port)``, in shard order (``LearnerContext.ps_addresses``).
        names: the model's parameter names, in the order tensors are given and returned.
        sizes: their element counts (for the shard assignment).
        timeout_s: how long a request may wait for a shard (its restart included), in s.
        secret: the job's parameter-server secret (``LABSWARM_PS_SECRET``); ``None`` for shards without one.

    Raises:
        ParameterServerError: no shard address.
    """

    def __init__(self, addresses: Sequence[tuple[str, int]], names: Sequence[str], sizes: Sequence[int],
                 timeout_s: float = 30.0, secret: str | None = None) -> None:
        if not addresses:
            raise ParameterServerError("no parameter-server shard address (LABSWARM_PS_ADDRS is empty)")
        self.addresses, self.names, self.timeout_s = list(addresses), list(names), timeout_s
        self._secret = secret or None
        shard_of = assign_shards(dict(zip(names, sizes, strict=True)), len(addresses))
        #: per shard, the positions (in ``names``) of its parameters
        self.members = [[i for i, n in enumerate(self.names) if shard_of[n] == s] for s in range(len(addresses))]
        self._socks: list[socket.socket | None] = [None] * len(addresses)
        self._pool = ThreadPoolExecutor(max_workers=len(addresses))
        #: the shards' versions at this learner's last pull (for staleness)
        self.versions = [0] * len(addresses)
        self.bytes_sent = 0

    def _request(self, shard: int, header: dict[str, Any], tensors: Sequence[Any]) -> tuple[dict[str, Any], list]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                sock = self._socks[shard]
                if sock is None:
                    sock = socket.create_connection(self.addresses[shard], timeout=self.timeout_s + 5)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._socks[shard] = sock
                    client_handshake(sock, self._secret, f"{shard} at {self.addresses[shard]}")
                sent = send(sock, header, list(tensors))
                reply, arrays = recv(sock)
                break
            except AuthError as exc:  # a wrong or missing secret does not heal: no retry
                self._drop(shard)
                raise ParameterServerError(str(exc)) from exc
            except OSError as exc:  # refused while it restarts, reset when it died: a new connection
                self._drop(shard)
                if time.monotonic() > deadline:
                    raise ParameterServerError(f"shard {shard} at {self.addresses[shard]} unreachable for "
                                               f"{self.timeout_s} s: {exc}") from exc
                time.sleep(0.05)  # waiting for a restarting process: no event to wait on
        self.bytes_sent += sent
        if "error" in reply:
            raise ParameterServerError(f"shard {shard} refused {header.get('op')}: {reply['error']}")
        return reply, arrays

    def _drop(self, shard: int) -> None:
        sock, self._socks[shard] = self._socks[shard], None
        if sock is not None:
            sock.close()

    def _each(self, fn: Any) -> list[Any]:
        """``fn(shard)`` on every shard at once; results in shard order."""
        return list(self._pool.map(fn, range(len(self.addresses))))

    def _part(self, shard: int, tensors: Sequence[Any]) -> list[Any]:
        return [tensors[i] for i in self.members[shard]]

    def _merge(self, parts: list[list[np.ndarray]]) -> list[np.ndarray]:
        out: list[Any] = [None] * len(self.names)
        for shard, arrays in enumerate(parts):
            for i, a in zip(self.members[shard], arrays, strict=True):
                out[i] = a
        return out

    def init(self, params: Sequence[Any], optimizer: Mapping[str, Any] | None) -> None:
        """Offer the starting parameters and the optimizer (``{kind, defaults}``) the shards apply pushes with;
        a shard that has parameters already (a checkpoint, another learner) keeps its own."""
        self._each(lambda s: self._request(s, {"op": "init", "names": [self.names[i] for i in self.members[s]],
                                               "optimizer": optimizer}, self._part(s, params)))

    def pull(self) -> list[np.ndarray]:
        """The current parameters, float arrays in ``names`` order; records each shard's version."""
        def one(s: int) -> list[np.ndarray]:
            reply, arrays = self._request(s, {"op": "pull"}, [])
            self.versions[s] = int(reply["version"])
            return arrays
        return self._merge(self._each(one))

    def push(self, grads: Sequence[Any]) -> int:
        """Send gradients for the shards to apply at once (asynchronous).

        Returns:
            The staleness: the most updates any shard applied since this learner's last pull.
        """
        replies = self._each(lambda s: self._request(s, {"op": "push", "since": self.versions[s]},
                                                     self._part(s, grads))[0])
        return max(int(r["staleness"]) for r in replies)

    def push_sync(self, grads: Sequence[Any]) -> list[np.ndarray]:
        """Join a synchronous round with these gradients; returns the parameters after the round's update."""
        def one(s: int) -> list[np.ndarray]:
            reply, arrays = self._request(s, {"op": "push_sync"}, self._part(s, grads))
            self.versions[s] = int(reply["version"])
            return arrays
        return self._merge(self._each(one))

    def elastic(self, params: Sequence[Any], alpha: float) -> list[np.ndarray]:
        """Elastic averaging: send this learner's parameters; returns ``alpha (x - center)`` per parameter (the
        center has moved by it; the learner subtracts it)."""
        return self._merge(self._each(
            lambda s: self._request(s, {"op": "elastic", "alpha": alpha}, self._part(s, params))[1]))

    def close(self) -> None:
        """Close the connections."""
        for shard in range(len(self._socks)):
            self._drop(shard)
        self._pool.shutdown(wait=False)
