"""Authentication of the manager's HTTP API: every route but ``/health`` needs ``Authorization: Bearer <token>``.

Tokens: ``LABSWARM_API_TOKEN`` (the user ``admin``, role admin), the named tokens of ``LABSWARM_TOKENS_FILE``
(:mod:`labswarm.auth.tokens`), and ``LABSWARM_METRICS_TOKEN``, which only ``/metrics`` accepts (a Prometheus
scrape token). Only SHA-256 digests are held; a presented token is hashed and compared with every digest in
constant time (``hmac.compare_digest`` on bytes), so neither the match nor its position leaks through timing.

The header is parsed strictly from the raw bytes (RFC 7235 / 6750): exactly one ``Authorization`` header,
``<scheme> <token>`` with the scheme ``Bearer`` in any case, one space, a token of visible ASCII characters.
Anything else (no header, ``Bearer`` alone, two spaces, a trailing space, ``Basic ...``, non-ASCII bytes, two
headers, a wrong token) is a 401 with ``WWW-Authenticate: Bearer``, never a 500.

A manager with no token at all (no ``api_token``, no tokens file) is *open to loopback only*: requests from
127.0.0.1/::1 are the admin ``local`` (the zero-configuration embedded default), any other client gets a 401.
Serving such an app on another address is refused (:func:`check_bind`); ``labswarm manager`` generates a token
instead and prints it once (:func:`ensure_token`), as Jupyter does.

``/docs`` and ``/openapi.json`` stay open: they hold the shape of the API (public in the source), no data and no
secret, and a browser must load them before it can send a token (the docs page's Authorize button then sends it
with every call it tries).

Routes get the caller with ``Depends(current_user)`` (or ``request.state.user``): a :class:`User` with a name and
a role. The seam for owners (a schema change not made here): creating routes pass ``owner=user.name`` to the
service, which records it; listing routes pass ``owner=None if user.is_admin else user.name`` as a filter; a route
on one object answers 404 (not 403: existence is not disclosed) when a ``user`` is not its owner;
``require_admin`` guards what only an admin may do. Workers authenticate with ``LABSWARM_API_TOKEN`` (admin).

Scoped tokens: a service may add a hook (:meth:`Authenticator.add_scoped`) that is asked, with the SHA-256 of a
token no configured token matched, whether it issued that token; the :class:`User` it answers carries a
``scope``, the one request (``"POST /v1/jobs/{id}/attempts/{n}/reports"``) the token opens: any other request
with it is a 401. The training jobs give each attempt's learners such a token
(:mod:`labswarm.jobs.records.credentials`).
A hook may cost a database query, so a flood of wrong tokens must not cost one each: the hooks are asked only
about a token of the shape the manager issues (:data:`ISSUED_TOKEN`, what :func:`~labswarm.auth.tokens.new_token`
makes), and a digest that no hook knew is remembered as unknown for :data:`UNKNOWN_TTL` seconds (the newest
:data:`UNKNOWN_SIZE` of them: :class:`UnknownTokens`), so the same wrong token is looked up once per TTL. Only
negative answers are kept: a token revoked (its digest cleared in the database) fails at its next request. A
token issued after its digest was remembered as unknown (presented before the row that holds it was committed)
opens its route once the entry expires: a learner's reporter retries a refused report. A flood of *different*
wrong tokens is bounded per client address instead (:class:`~labswarm.auth.failures.FailureBudget`): past its
budget of wrong tokens a client is answered 429 with ``Retry-After``; its configured tokens still open, and its
issued-shape tokens are still looked up (all local learners report from 127.0.0.1, so one stale learner must
not lock the others out) within a second, smaller bucket of lookups per address
(:func:`~labswarm.auth.failures.lookup_budget`), which only wrong tokens found by a lookup drain.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TextIO

from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from labswarm.auth.cookie import cookie_token
from labswarm.auth.failures import FailureBudget, lookup_budget, retry_after
from labswarm.auth.tokens import TokenEntry, User, check_token, hash_token, load_tokens, new_token
from labswarm.errors import ManagerError
from labswarm.settings import Settings

#: Routes that answer without a token (liveness, for load balancers and container health checks).
PUBLIC_PATHS = frozenset({"/health"})
#: Routes that also accept the scrape token.
METRICS_PATHS = frozenset({"/metrics"})
#: The caller on an open (token-less) manager, from loopback.
LOCAL = User("local", "admin")
#: The caller that presented the scrape token (``/metrics`` only).
SCRAPER = User("metrics", "user")
#: ``<scheme> <token>``: one space, a token of visible ASCII (no space, no control, no byte >= 0x80).
_CREDENTIALS = re.compile(rb"\A([A-Za-z]+) ([\x21-\x7e]+)\Z")


def _unauthorized(reason: str, invalid: bool = False) -> HTTPException:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return HTTPException(401, reason, headers={"WWW-Authenticate": challenge})


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The token of the request's one ``Authorization: Bearer <token>`` header, as bytes.

    Args:
        headers: the raw ASGI headers (``scope["headers"]``: lower-case names, undecoded values).

    Raises:
        HTTPException: 401 with ``WWW-Authenticate: Bearer``: no header, several, or not ``Bearer <token>``.
    """
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if not values:
        raise _unauthorized("missing API token: send Authorization: Bearer <token>")
    if len(values) > 1:
        raise _unauthorized("several Authorization headers", invalid=True)
    match = _CREDENTIALS.match(values[0])
    if match is None or match[1].lower() != b"bearer":
        raise _unauthorized("malformed Authorization header: expected 'Bearer <token>' (one space, the token "
                            "in visible ASCII characters)", invalid=True)
    return match[2]


#: A scoped-token hook: the SHA-256 (32 bytes) of a presented token -> the scoped :class:`User` it is, or ``None``.
ScopedTokens = Callable[[bytes], User | None]
#: The shape of the tokens the manager issues (:func:`~labswarm.auth.tokens.new_token`: 32 random bytes in
#: URL-safe base64 without padding, 43 characters): the scoped-token hooks are asked about no other.
ISSUED_TOKEN = re.compile(rb"\A[A-Za-z0-9_-]{43}\Z")
#: Digests of wrong tokens remembered (the newest kept) and for how long, seconds: a flood of one wrong token
#: costs one lookup per :data:`UNKNOWN_TTL`; a token issued while its digest is remembered opens after it.
UNKNOWN_SIZE, UNKNOWN_TTL = 1_024, 5.0


class UnknownTokens:
    """Digests that no scoped-token hook knew, each for ``ttl`` seconds, the newest ``size`` kept (LRU); safe to
    share between threads.

    Args:
        size: entries kept, default :data:`UNKNOWN_SIZE`.
        ttl: seconds an entry is trusted, default :data:`UNKNOWN_TTL` (monotonic clock).
    """

    def __init__(self, size: int = UNKNOWN_SIZE, ttl: float = UNKNOWN_TTL) -> None:
        self.size, self.ttl = size, ttl
        self._until: OrderedDict[bytes, float] = OrderedDict()  # digest: monotonic time it expires at
        self._lock = threading.Lock()

    def __contains__(self, digest: bytes) -> bool:
        """Whether ``digest`` was found unknown less than ``ttl`` seconds ago."""
        with self._lock:
            until = self._until.get(digest)
            if until is None:
                return False
            if until <= time.monotonic():
                del self._until[digest]
                return False
            self._until.move_to_end(digest)
            return True

    def add(self, digest: bytes) -> None:
        """Remember ``digest`` as unknown for ``ttl`` seconds (the oldest entry goes past ``size``)."""
        with self._lock:
            self._until[digest] = time.monotonic() + self.ttl
            self._until.move_to_end(digest)
            while len(self._until) > self.size:
                self._until.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)


class Authenticator:
    """The tokens a manager accepts, as SHA-256 digests, and who each one is.

    Args:
        entries: named tokens (users).
        scrape: digests of tokens that ``/metrics`` alone accepts.
        scoped: hooks asked about a token that no entry matches (see :meth:`add_scoped`).
        unknown: the digests the hooks did not know, remembered a while (default: a fresh :class:`UnknownTokens`).
        failures: the wrong tokens each client address may still present (default: a fresh
            :class:`~labswarm.auth.failures.FailureBudget`).
        lookups: the lookups of issued-shape tokens an address past ``failures`` may still cause (default:
            :func:`~labswarm.auth.failures.lookup_budget` of ``failures``).
    """

    def __init__(self, entries: Iterable[TokenEntry] = (), scrape: Iterable[bytes] = (),
                 scoped: Iterable[ScopedTokens] = (), unknown: UnknownTokens | None = None,
                 failures: FailureBudget | None = None, lookups: FailureBudget | None = None) -> None:
        self.entries = list(entries)
        self.scrape = list(scrape)
        self.scoped = list(scoped)
        self.unknown = unknown or UnknownTokens()
        self.failures = failures or FailureBudget()
        self.lookups = lookups or lookup_budget(self.failures)

    def add_scoped(self, hook: ScopedTokens) -> None:
        """Also accept the tokens ``hook`` issued: it gets the SHA-256 of a token that no configured token
        matched and answers the :class:`User` it is, whose ``scope`` must name the one request the token opens
        (``BearerAuth`` refuses it on any other). The hook compares digests in constant time itself. It is asked
        only about tokens of the shape :func:`~labswarm.auth.tokens.new_token` makes (:data:`ISSUED_TOKEN`),
        and not again for :data:`UNKNOWN_TTL` seconds about a digest that no hook knew (:class:`UnknownTokens`):
        it must issue its tokens with ``new_token``; a positive answer is never kept (revocation is immediate)."""
        self.scoped.append(hook)

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        """``api_token`` (user ``admin``), the tokens file's users, the scrape token; the wrong tokens a client
        may present (``auth_failure_burst``, ``auth_failure_rate``).

        Raises:
            ConfigError: a token that no header could carry (the field is named), or an invalid tokens file.
        """
        entries = []
        if settings.api_token:
            check_token(settings.api_token, "api_token")
            entries.append(TokenEntry(User("admin", "admin"), hash_token(settings.api_token)))
        if settings.tokens_file is not None:
            entries += load_tokens(settings.tokens_file)
        scrape = []
        if settings.metrics_token:
            check_token(settings.metrics_token, "metrics_token")
            scrape.append(hash_token(settings.metrics_token))
        return cls(entries, scrape, failures=FailureBudget(settings.auth_failure_burst, settings.auth_failure_rate))

    @property
    def open(self) -> bool:
        """No token configured: loopback clients only, each the admin ``local``."""
        return not self.entries

    def user(self, token: bytes, metrics: bool = False, lookup: bool = True) -> User | None:
        """Who ``token`` is (``None``: nobody). Every digest is compared, in constant time, whatever matches; the
        scoped hooks are asked only about a token that none matched, of the issued shape, not known as unknown
        (see :meth:`add_scoped`), and not at all without ``lookup``."""
        return self.find(token, metrics, lookup)[0]

    def may_look_up(self, token: bytes) -> bool:
        """Whether :meth:`identify` may ask the scoped hooks about ``token`` (perhaps a database query: call it in a
        thread then): there are hooks, the token has the issued shape, no configured token is it (every digest
        compared) and it is not remembered as unknown."""
        if not self.scoped or not ISSUED_TOKEN.match(token):
            return False
        digest = hash_token(token)
        configured = [hmac.compare_digest(digest, entry.sha256) for entry in self.entries]
        return not any(configured) and digest not in self.unknown

    def find(self, token: bytes, metrics: bool = False, lookup: bool = True) -> tuple[User | None, bool]:
        """:meth:`user`, and whether the scoped hooks were asked (a lookup, perhaps a database query, was made)."""
        digest = hash_token(token)
        found = None
        for entry in self.entries:
            if hmac.compare_digest(digest, entry.sha256) and found is None:
                found = entry.user
        for scrape in self.scrape:
            if hmac.compare_digest(digest, scrape) and found is None and metrics:
                found = SCRAPER
        if found is not None or not self.scoped or not lookup or not ISSUED_TOKEN.match(token) \
                or digest in self.unknown:
            return found, False
        for hook in self.scoped:
            if found is None:
                found = hook(digest)
        if found is None:
            self.unknown.add(digest)
        return found, True

    def identify(self, token: bytes, client: str, metrics: bool = False) -> User:
        """Who ``token`` presented by the address ``client`` is, within the address's budgets: a wrong token
        charges :attr:`failures`; past it, a token is still looked up while :attr:`lookups` is not empty, and a
        wrong token so looked up charges that too.

        Raises:
            HTTPException: 401 (``WWW-Authenticate: Bearer``) for a wrong token; 429 with ``Retry-After`` for a
                wrong token past the failure budget, or any unknown token past both budgets.
        """
        wait = self.failures.wait(client)
        lookup_wait = None if wait is None else self.lookups.wait(client)
        found, looked = self.find(token, metrics=metrics, lookup=lookup_wait is None)
        if found is not None:
            return found
        if wait is None:
            self.failures.charge(client)
            raise _unauthorized("wrong API token", invalid=True)
        if looked:
            self.lookups.charge(client)
        seconds = wait if lookup_wait is None else max(wait, lookup_wait)
        raise HTTPException(429, f"too many wrong API tokens from {client or 'this client'}: try again in "
                                 f"{retry_after(seconds)} s (auth_failure_burst, auth_failure_rate)",
                            headers={"Retry-After": retry_after(seconds)})


class BearerAuth(SecurityBase):
    """The app-wide FastAPI dependency: authenticates each request, sets ``request.state.user`` and returns it
    (``None`` on public routes). Declared as an HTTP bearer security scheme in the OpenAPI schema.

    Args:
        authenticator: the tokens accepted.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator
        self.model = HTTPBearerModel(description="LABSWARM_API_TOKEN, or a named token of LABSWARM_TOKENS_FILE")
        self.scheme_name = "bearer"

    async def __call__(self, request: Request) -> User | None:
        """:meth:`authenticate` on the event loop, or in a thread when it may ask a scoped hook (a database query):
        most requests spare the hand-over to a thread and back (issue 25: the prediction endpoint's latency)."""
        if self.authenticator.scoped and not self.authenticator.open:
            try:
                token = cookie_token(request) or bearer_token(request.scope["headers"])
            except HTTPException:  # refused without a lookup, by authenticate
                token = b""
            if self.authenticator.may_look_up(token):
                return await run_in_threadpool(self.authenticate, request)
        return self.authenticate(request)

    def authenticate(self, request: Request) -> User | None:
        """The request's user (``None`` on a public route), set as ``request.state.user``; may ask a scoped hook.

        Raises:
            HTTPException: 401 (no token, a wrong one, a scoped token on another request, a non-loopback client of
                an open manager), 429 (past the client's budget of wrong tokens).
        """
        route = request.scope.get("route")
        path = getattr(route, "path", None) or request.url.path
        if path in PUBLIC_PATHS:
            request.state.user = None
            return None
        if self.authenticator.open:
            client = request.client.host if request.client else ""
            if not is_loopback(client):
                raise _unauthorized("this manager has no API token and answers loopback clients only: "
                                    "set LABSWARM_API_TOKEN")
            user = LOCAL
        else:
            token = cookie_token(request)  # the dashboard's cookie (labswarm.auth.cookie), when there is no header
            token = bearer_token(request.scope["headers"]) if token is None else token
            client = request.client.host if request.client else ""
            user = self.authenticator.identify(token, client, metrics=path in METRICS_PATHS)
            if user.scope is not None and user.scope != f"{request.method} {request.scope['path']}":
                raise _unauthorized("this token is scoped to one request (a learner's report route): not this one",
                                    invalid=True)
        request.state.user = user
        return user


def current_user(request: Request) -> User:
    """Route dependency: the authenticated caller (the app-wide :class:`BearerAuth` ran first).

    Raises:
        HTTPException: 401 on a route that is public (no caller).
    """
    user = getattr(request.state, "user", None)
    if user is None:
        raise _unauthorized("missing API token: send Authorization: Bearer <token>")
    return user


def require_admin(request: Request) -> User:
    """Route dependency: the caller, who must be an admin.

    Raises:
        HTTPException: 401 without a caller, 403 for a ``user``.
    """
    user = current_user(request)
    if not user.is_admin:
        raise HTTPException(403, f"{user.name} is not an admin")
    return user


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine only; a wildcard (``0.0.0.0``, ``::``,
    empty) or any other name is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ensure_token(settings: Settings, host: str, out: TextIO | None = None) -> Settings:
    """The settings to serve with on ``host``: with a generated ``api_token`` when the manager would otherwise
    be open beyond loopback (printed once on ``out``, default stderr), or when only a tokens file is configured
    (its local workers need a token; this one is not printed). Unchanged otherwise.

    Raises:
        ConfigError: an invalid tokens file.
    """
    if settings.api_token:
        return settings
    if settings.tokens_file is not None and load_tokens(settings.tokens_file):
        return settings.model_copy(update={"api_token": new_token()})
    if is_loopback(host):
        return settings
    token = new_token()
    print(f"labswarm manager: no API token was configured (LABSWARM_API_TOKEN) and {host or '*'} is not a "
          f"loopback address, so this one was generated; clients send it as Authorization: Bearer <token>:\n"
          f"    {token}", file=out or sys.stderr, flush=True)
    return settings.model_copy(update={"api_token": token})


def check_bind(auth: Authenticator | None, host: str) -> None:
    """Refuse to serve an open manager (no token) on a non-loopback address.

    Raises:
        ManagerError: ``auth`` is open and ``host`` is not loopback.
    """
    if auth is not None and auth.open and not is_loopback(host):
        raise ManagerError(f"refusing to serve a manager without an API token on {host or '*'} (not loopback): "
                           "set LABSWARM_API_TOKEN or LABSWARM_TOKENS_FILE (`labswarm manager` generates one)")
