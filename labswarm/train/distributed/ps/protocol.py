"""The wire format between learners and parameter-server shards: one message = a JSON header + raw tensors.

Frame: 8-byte big-endian header length, the header (UTF-8 JSON with ``tensors``: ``[[dtype, shape], ...]``),
then each tensor's bytes (C order, native byte order: learners and shards run the same build). Tensors travel
as CPU float tensors; the header carries the operation and its arguments.

Why not torch.distributed: point-to-point ``send``/``recv`` needs one process group of fixed membership for
learners and shards, and a dead member fails every peer's next operation (gloo: "Connection reset by peer"),
while an asynchronous framework must restart one learner alone and a shard must restart from its checkpoint
while the learners wait. torch RPC has fixed membership too and is in maintenance mode. A plain TCP connection
per learner and shard can drop and reconnect; this module is the only place that knows the transport
(:class:`labswarm.train.distributed.ps.client.ParameterServerClient` is the interface).
"""

from __future__ import annotations

import json
import math
import socket
import struct
from typing import Any

import numpy as np

#: Header length prefix: unsigned 64-bit, big-endian.
_LEN = struct.Struct(">Q")
#: Largest header accepted, in bytes (a guard against a stray connection sending garbage).
MAX_HEADER = 1 << 20
#: Largest buffer allocated ahead of the bytes that fill it, in bytes (64 MiB; larger tensors grow by it).
_PIECE = 1 << 26


class ProtocolError(ConnectionError):
    """A malformed frame, or the peer closed the connection mid-message."""


def send(sock: socket.socket, header: dict[str, Any], tensors: list[Any] = ()) -> int:  # type: ignore[assignment]
    """Send one message.

    Args:
        sock: a connected socket.
        header: JSON-serializable mapping (``tensors`` is set here).
        tensors: CPU torch tensors or numpy arrays.

    Returns:
        Bytes of tensor data sent.

    Raises:
        OSError: the connection failed.
    """
    arrays = [np.ascontiguousarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t) for t in tensors]
    head = json.dumps({**header, "tensors": [[a.dtype.str, list(a.shape)] for a in arrays]}).encode()
    sock.sendall(_LEN.pack(len(head)) + head)
    for a in arrays:
        sock.sendall(a.data.cast("B"))  # the array's own memoryview: no copy
    return sum(a.nbytes for a in arrays)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Receive one message: ``(header, arrays)``; arrays are writable numpy arrays.

    Raises:
        ProtocolError: the peer closed the connection or sent a malformed frame (a header over
            :data:`MAX_HEADER`, a tensor of a non-numeric dtype or a negative dimension).
        OSError: the connection failed (including a timeout set on the socket).
    """
    (size,) = _LEN.unpack(_exact(sock, _LEN.size))
    if size > MAX_HEADER:
        raise ProtocolError(f"header of {size} bytes (at most {MAX_HEADER})")
    try:
        header = json.loads(_exact(sock, size))
        specs = [_spec(d, shape) for d, shape in header.pop("tensors")]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed header: {exc}") from exc
    arrays = []
    for dtype, shape in specs:
        n = math.prod(shape) * dtype.itemsize
        arrays.append(np.frombuffer(_exact(sock, n), dtype=dtype).reshape(shape))
    return header, arrays


def _spec(dtype: Any, shape: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """A tensor's ``(dtype, shape)`` from the header: a numeric dtype and non-negative integer dimensions.

    Raises:
        ValueError: another dtype (object arrays cannot come from bytes) or shape.
    """
    dt = np.dtype(dtype)
    if dt.kind not in "biufc":
        raise ValueError(f"tensor dtype {dt.str!r} is not numeric")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError("tensor shape must be a list of non-negative integers")
    return dt, tuple(shape)


def _exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from ``sock``, allocated as they arrive (at most :data:`_PIECE` ahead of them): a size
    a peer declares is never allocated before its bytes come."""
    if n > _PIECE:
        pieces = bytearray()
        while len(pieces) < n:
            pieces += _exact(sock, min(_PIECE, n - len(pieces)))
        return pieces
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ProtocolError("connection closed by the peer")
        got += k
    return buf
