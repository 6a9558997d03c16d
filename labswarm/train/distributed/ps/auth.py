"""The job's parameter-server secret and the handshake that proves it, on every shard connection.

The lifecycle makes one secret per job (:func:`new_secret`, where the job's cluster is made, so an asynchronous
learner restarted alone gets the same one) and hands it to the shards and the learners through their
environment only (:data:`SECRET_ENV`; never a command line, which ``ps`` shows to every user of the machine).

Handshake (challenge-response, HMAC-SHA256, both ways), the first messages of a connection in the
:mod:`~labswarm.train.distributed.ps.protocol` framing:

1. shard → learner: ``{"nonce": hex}``, 32 random bytes; ``{"nonce": null}`` from a shard without a secret;
2. learner → shard: ``{"op": "auth", "mac": HMAC(secret, "client:" + nonce), "nonce": its own 32 bytes}``;
3. shard → learner: ``{"mac": HMAC(secret, "server:" + learner's nonce)}`` if the learner's MAC matches (compared
   in constant time, ``hmac.compare_digest``), else ``{"error": ...}`` and the shard closes the connection.

The learner checks the shard's MAC too, so a process that took a dead shard's port cannot pose as the shard. A
learner with a secret refuses a shard without one; a shard without a secret (tests, a shard started by hand)
answers any learner but listens on loopback only (:func:`check_bind`). Failures raise :class:`AuthError`, which
the client does not retry.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket

from labswarm.errors import ConfigError, LabswarmError
from labswarm.ports import listen_free
from labswarm.train.distributed.ps.protocol import recv, send

#: The environment variable that carries the job's parameter-server secret to its shards and learners.
SECRET_ENV = "LABSWARM_PS_SECRET"
#: Bytes of a nonce and of a secret (256 bits: HMAC-SHA256's block-size-independent strength).
NONCE_BYTES = 32
#: Seconds a shard waits for a connecting learner's answer before it drops the connection.
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections a shard's listening socket queues before it accepts them (``listen()``'s backlog): learners that
#: connect while a revived shard still loads torch and its checkpoint wait there (socketserver's default is 5).
LISTEN_BACKLOG = 128


class AuthError(LabswarmError):
    """A handshake failed: a wrong or missing secret on either side (the message says which)."""


def new_secret() -> str:
    """A fresh job secret: 32 random bytes (``secrets.token_hex``), as 64 hex characters."""
    return secrets.token_hex(NONCE_BYTES)


def _mac(secret: str, role: str, nonce: str) -> str:
    return hmac.new(secret.encode(), f"{role}:{nonce}".encode(), hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    """Every address ``host`` resolves to is a loopback one (``127.0.0.0/8``, ``::1``); an address that does not
    resolve counts as not loopback."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_bind(host: str, secret: str | None) -> None:
    """A shard without a secret may listen on loopback only.

    Raises:
        ConfigError: ``host`` is not loopback and there is no secret (the error names ``host`` and
            :data:`SECRET_ENV`).
    """
    if not secret and not is_loopback(host):
        raise ConfigError([("host", f"a parameter-server shard listens on {host!r}, beyond loopback, only with the "
                                    f"job's secret in {SECRET_ENV}")])


def listen(host: str, port: int, secret: str | None) -> socket.socket:
    """A shard's listening TCP socket (IPv6 where ``host`` has a ``:``, else IPv4; ``SO_REUSEADDR`` as socketserver
    sets it, so a revived shard can take its port back from the connections of the one that died), bound through
    :func:`labswarm.ports.listen_free` whether the port is chosen now or is a revived shard's own; stdlib only, so
    a shard holds its port before it imports torch. Connections wait in its backlog (:data:`LISTEN_BACKLOG`) until
    the server accepts them.

    Args:
        host: the address to listen on; beyond loopback only with a secret (:func:`check_bind`).
        port: the port (a revived shard's, say); 0: a free one below the kernel's ephemeral range (read it with
            ``getsockname()``).
        secret: the job's secret, or ``None``.

    Raises:
        ConfigError: ``host`` is not loopback and there is no secret.
        OSError: the address cannot be bound (the port is taken, say).
    """
    check_bind(host, secret)
    # port 0: below the ephemeral range, so a revived shard binds this port again; one bind path for both (IPv6 too)
    return listen_free(host, LISTEN_BACKLOG, port=port)


def server_handshake(sock: socket.socket, secret: str | None) -> bool:
    """The shard's side, on a new connection; ``True`` when the learner may go on (the connection is left as it
    was: no timeout). On ``False`` the caller closes the connection.

    Raises:
        OSError: the connection failed or the learner took longer than :data:`HANDSHAKE_TIMEOUT_S`.
        labswarm.train.distributed.ps.protocol.ProtocolError: a malformed message.
    """
    if not secret:
        send(sock, {"nonce": None})
        return True
    nonce = secrets.token_hex(NONCE_BYTES)
    previous = sock.gettimeout()
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        send(sock, {"nonce": nonce})
        header, arrays = recv(sock)
        mac, theirs = header.get("mac"), header.get("nonce")
        if (header.get("op") != "auth" or arrays or not isinstance(mac, str) or not isinstance(theirs, str)
                or not hmac.compare_digest(mac.encode(), _mac(secret, "client", nonce).encode())):
            send(sock, {"error": "authentication failed: not this job's parameter-server secret"})
            return False
        send(sock, {"mac": _mac(secret, "server", theirs)})
        return True
    finally:
        sock.settimeout(previous)


def client_handshake(sock: socket.socket, secret: str | None, where: str) -> None:
    """The learner's side, on a new connection to the shard ``where`` (for messages).

    Raises:
        AuthError: the shard refused this learner's secret, asked for one this learner lacks, has none while this
            learner has one, or did not prove it holds the same secret.
        OSError: the connection failed (the client retries those).
    """
    header, _ = recv(sock)
    nonce = header.get("nonce")
    if nonce is None:
        if secret:
            raise AuthError(f"parameter-server shard {where} has no secret while this learner has the job's "
                            f"({SECRET_ENV}): not this job's shard")
        return
    if not secret:
        raise AuthError(f"parameter-server shard {where} asks for the job's secret and {SECRET_ENV} is not set")
    mine = secrets.token_hex(NONCE_BYTES)
    send(sock, {"op": "auth", "mac": _mac(secret, "client", str(nonce)), "nonce": mine})
    reply, _ = recv(sock)
    if "error" in reply:
        raise AuthError(f"parameter-server shard {where} refused this learner: {reply['error']} ({SECRET_ENV})")
    mac = reply.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac.encode(), _mac(secret, "server", mine).encode()):
        raise AuthError(f"parameter-server shard {where} did not prove the job's secret ({SECRET_ENV})")
