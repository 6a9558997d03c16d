"""The wrong tokens a client may present before it is answered 429 (:class:`FailureBudget`), and the database
lookups of issued-shape tokens it may still cause past that (:func:`lookup_budget`), so that a flood of wrong
tokens cannot cost the manager a database lookup each (:mod:`labswarm.auth.authenticator`), while a valid token
from the same address (every local learner reports from 127.0.0.1) is still looked up and accepted.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: Wrong tokens one client address may present in a burst, and regains per second (the settings
#: ``auth_failure_burst`` and ``auth_failure_rate``); client addresses remembered (the least recently seen go).
#: 200: a client that tries every route once with a wrong token (a misconfigured script, the API's own sweep test)
#: stays under it; 10/s: a flooding address costs at most 10 lookups of the attempts' digests a second.
FAILURE_BURST, FAILURE_RATE, FAILURE_CLIENTS = 200, 10.0, 10_000
#: The lookup budget past the failure budget, as a fraction of it (burst and rate): 200 and 10/s give 50
#: lookups in a burst and 2.5/s, enough for 12 distinct stale tokens (revoked attempts' learners still reporting:
#: each is looked up once per :data:`~labswarm.auth.authenticator.UNKNOWN_TTL`, 5 s) from one address at once.
LOOKUP_SHARE = 0.25


class FailureBudget:
    """The wrong tokens each client address may still present: a token bucket per address (``burst`` at most,
    ``rate`` regained per second), as fail2ban or nginx's ``limit_req`` bound a client's failed logins. A client
    whose bucket is empty is answered 429 with ``Retry-After`` instead of 401 for a wrong token. Its tokens are
    still compared with the configured ones, and a token of the issued shape is still looked up (through the
    negative cache, :class:`~labswarm.auth.authenticator.UnknownTokens`) while the address's second bucket,
    :func:`lookup_budget`, is not empty: a wrong token found unknown by a lookup past the budget costs one of that
    bucket. So a flood of *different* wrong issued-shape tokens from one address costs at most ``burst`` plus the
    lookup bucket's burst lookups, then both rates a second; the same wrong token repeated (a revoked attempt's
    learner still reporting) costs one lookup per TTL; a valid configured token is always accepted, and a valid
    scoped token (a learner's report) is accepted unless that address has also emptied its lookup bucket with
    distinct wrong issued-shape tokens (then 429 with ``Retry-After`` until it refills: the learner's reporter
    retries). Safe to share between threads.

    Args:
        burst: wrong tokens a client may present at once (default :data:`FAILURE_BURST`).
        rate: wrong tokens a client regains per second (default :data:`FAILURE_RATE`).
        clients: addresses remembered, the least recently charged forgotten first (default
            :data:`FAILURE_CLIENTS`; a forgotten address starts again with a full bucket).
        clock: monotonic seconds (a test passes its own).
    """

    def __init__(self, burst: int = FAILURE_BURST, rate: float = FAILURE_RATE, clients: int = FAILURE_CLIENTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.clients, self.clock = burst, rate, clients, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address: (left, at time)
        self._lock = threading.Lock()

    def _left(self, client: str, now: float) -> float:
        left, at = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), left + (now - at) * self.rate)

    def wait(self, client: str) -> float | None:
        """Seconds until ``client`` may present one more wrong token; ``None``: it may now."""
        with self._lock:
            left = self._left(client, self.clock())
        return None if left >= 1.0 else (1.0 - left) / self.rate

    def charge(self, client: str) -> None:
        """Count one wrong token of ``client``."""
        with self._lock:
            now = self.clock()
            self._buckets[client] = (max(0.0, self._left(client, now) - 1.0), now)
            self._buckets.move_to_end(client)
            while len(self._buckets) > self.clients:
                self._buckets.popitem(last=False)


def lookup_budget(failures: FailureBudget, share: float = LOOKUP_SHARE) -> FailureBudget:
    """The lookups of issued-shape tokens an address past ``failures`` may still cause: a bucket of ``share`` of
    its burst (at least 1) and rate, over as many addresses (default :data:`LOOKUP_SHARE`)."""
    return FailureBudget(max(1, int(failures.burst * share)), failures.rate * share, failures.clients,
                         failures.clock)


def retry_after(seconds: float) -> str:
    """The ``Retry-After`` value (RFC 9110: whole seconds, at least 1) for a wait of ``seconds``."""
    return str(max(1, math.ceil(seconds)))
