"""Monitors: poll the RabbitMQ management API and the manager API (asyncio + httpx).

The management API's statistics refresh every ~5 s, and some fields are null right after a broker boot: every
field here defaults to 0 / ``None`` instead of failing. The manager's ledger is fresher (outcomes arrive every
~0.25 s) and is used for the consume rate whenever it is there.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from labswarm.errors import ManagerError


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue as the broker sees it.

    Attributes:
        name: queue name.
        ready: messages waiting for a consumer.
        unacked: messages delivered and not yet acknowledged (tasks running).
        consumers: consumers (worker processes fetching) on the queue.
        publish_rate, deliver_rate, ack_rate: messages/s, as averaged by the management API (None if absent).
    """

    name: str
    ready: int
    unacked: int
    consumers: int
    publish_rate: float | None = None
    deliver_rate: float | None = None
    ack_rate: float | None = None


def _rate(stats: dict[str, Any] | None, key: str) -> float | None:
    if not stats:
        return None
    details = stats.get(f"{key}_details") or {}
    value = details.get("rate")
    return float(value) if value is not None else None


#: Running sessions' queues read one by one at most; more: the vhost's whole list in one request.
FEW_QUEUES = 8


def _stats(name: str, q: dict[str, Any]) -> QueueStats:
    stats = q.get("message_stats")
    return QueueStats(name=name, ready=int(q.get("messages_ready") or 0),
                      unacked=int(q.get("messages_unacknowledged") or 0), consumers=int(q.get("consumers") or 0),
                      publish_rate=_rate(stats, "publish"), deliver_rate=_rate(stats, "deliver_get"),
                      ack_rate=_rate(stats, "ack"))


class RabbitMQMonitor:
    """Reads the ``labswarm.*`` queues' depth, consumers and rates from the RabbitMQ management API.

    Args:
        api_url: e.g. ``http://guest:guest@localhost:15672`` (credentials in the URL, or ``auth``).
        vhost: the virtual host of the queues.
        auth: ``(user, password)`` when not in the URL.
        client: an ``httpx.AsyncClient`` to use (tests); one is created otherwise.
    """

    COLUMNS = ("name,messages_ready,messages_unacknowledged,consumers,message_stats.publish_details,"
               "message_stats.deliver_get_details,message_stats.ack_details")

    def __init__(self, api_url: str, vhost: str = "/", auth: tuple[str, str] | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        url = httpx.URL(api_url)
        if auth is None and url.username:
            auth = (url.username, url.password or "")
        self.base = str(url.copy_with(username=None, password=None)).rstrip("/")
        self.vhost = vhost
        self._client = client or httpx.AsyncClient(auth=auth or ("guest", "guest"), timeout=5.0)

    async def poll(self, names: Collection[str] | None = None) -> dict[str, QueueStats]:
        """Stats of the labswarm queues, by name: those named when they are few (at most :data:`FEW_QUEUES`, one
        request each), else every ``labswarm.*`` queue of the vhost (one request).

        Why not always the whole list: the management API builds every queue's entry of the vhost, whatever the
        columns asked, and a broker keeps the queues of past sessions; with ~340 queues a list cost RabbitMQ
        ~40 ms of CPU against ~2-5 for one queue (measured on the 2-core machine, 2026-11-26), each second of a
        running session, on the cores that compute its samples. A named queue that does not exist (not declared
        yet) is left out, as the list would.

        Args:
            names: the queues wanted (the running sessions'); ``None``: every labswarm queue.

        Raises:
            ManagerError: the management API cannot be reached or answers an error.
        """
        vhost = quote(self.vhost, safe="")
        if names is not None and len(names) <= FEW_QUEUES:
            out = {}
            for name in sorted(set(names)):
                if name.startswith("labswarm."):
                    q = await self._get(f"{self.base}/api/queues/{vhost}/{quote(name, safe='')}", missing_ok=True)
                    if isinstance(q, dict):
                        out[name] = _stats(name, q)
            return out
        listed = await self._get(f"{self.base}/api/queues/{vhost}")
        return {q["name"]: _stats(q["name"], q) for q in listed or () if q.get("name", "").startswith("labswarm.")}

    async def _get(self, url: str, missing_ok: bool = False) -> Any:
        """The JSON at ``url`` (the columns of :attr:`COLUMNS`); ``None`` for a 404 when ``missing_ok``."""
        try:
            response = await self._client.get(url, params={"columns": self.COLUMNS})
            if missing_ok and response.status_code == 404:
                return None
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ManagerError(f"RabbitMQ management API at {self.base}: {exc}") from exc
        return response.json()

    async def aclose(self) -> None:
        await self._client.aclose()


#: Most active sessions one poll reads (the manager's largest page; one active session per experiment).
MAX_ACTIVE = 1_000


class ManagerMonitor:
    """Reads the active sessions' progress from the manager and sets publish rates.

    Args:
        url: the manager's base URL.
        token: the manager's API token (needed to set rates when it has one).
        client: an ``httpx.AsyncClient`` to use (tests).
    """

    def __init__(self, url: str, token: str | None = None, client: httpx.AsyncClient | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._client = client or httpx.AsyncClient(base_url=self.url, headers=headers, timeout=5.0)

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._client.request(method, path, **kwargs)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ManagerError(f"manager at {self.url}: {exc}") from exc
        return response.json()

    async def sessions(self) -> list[dict[str, Any]]:
        """Progress of the active sessions, running or paused (``GET /sessions?status=running&status=paused``,
        at most :data:`MAX_ACTIVE`): the cost of a poll does not grow with the sessions ever run."""
        return await self._call("GET", "/sessions", params={"status": ["running", "paused"], "limit": MAX_ACTIVE})

    async def user_weights(self) -> tuple[dict[str, float], float] | None:
        """The users' fair-share weights as the manager applies them (``GET /v1/quotas``: the settings', the tokens
        file's and an admin's overrides, :mod:`labswarm.manager.quotas`): ``({user: weight}, the weight of any
        other user)``; ``None`` when the manager does not tell them to this token (a user's: 403; a manager
        without the route: 404).

        Raises:
            ManagerError: the manager could not be reached, or answered another error.
        """
        try:
            response = await self._client.get("/v1/quotas")
            if response.status_code in (403, 404):
                return None
            response.raise_for_status()
            data = response.json()
            return ({entry["user"]: float(entry["weight"]) for entry in data["users"]},
                    float(data["default"]["weight"]))
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise ManagerError(f"manager at {self.url}: the users' weights: {exc}") from exc

    async def set_rate(self, session_id: str, rate: float) -> None:
        """``PUT /sessions/{id}/rate``."""
        await self._call("PUT", f"/sessions/{session_id}/rate", json={"rate": rate})

    async def aclose(self) -> None:
        await self._client.aclose()
