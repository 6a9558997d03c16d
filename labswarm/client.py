"""A small client of the manager's HTTP API (httpx), used by workers, the CLI and the health controller."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from labswarm.errors import ManagerError


class HTTPClient:
    """The HTTP core of labswarm's API clients: one connection pool, the token, errors translated.

    Every failure becomes a :class:`~labswarm.errors.ManagerError` (``status`` and ``detail`` set from the answer:
    a 422's ``detail`` lists each invalid field's path and reason).

    Args:
        url: the manager's base URL, e.g. ``http://127.0.0.1:8000``.
        token: the API token (``LABSWARM_API_TOKEN``) sent as ``Authorization: Bearer``.
        timeout: seconds per request.
        transport: an httpx transport (tests).
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; the decoded JSON answer, or ``None`` for an empty one (e.g. 204).

        Raises:
            ManagerError: the manager answered an error status, or cannot be reached.
        """
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ManagerError(f"cannot reach the manager at {self.url}: {exc}") from exc
        raise_for_status(response, method, path)
        return response.json() if response.content else None


def raise_for_status(response: httpx.Response, method: str, path: str) -> None:
    """Raise a :class:`~labswarm.errors.ManagerError` for an error answer (status >= 400); nothing otherwise."""
    if response.status_code < 400:
        return
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text
    raise ManagerError(f"{method} {path}: HTTP {response.status_code}: {_describe(detail)}",
                       status=response.status_code, detail=detail)


class ManagerClient(HTTPClient):
    """Calls the manager's experiments and sessions API; every error becomes a
    :class:`~labswarm.errors.ManagerError`.

    Args:
        url: the manager's base URL, e.g. ``http://127.0.0.1:8000``.
        token: the API token (``LABSWARM_API_TOKEN``) sent as ``Authorization: Bearer``.
        timeout: seconds per request.
        transport: an httpx transport (tests).
    """

    # experiments
    def post_experiment(self, config: Mapping[str, Any] | str) -> dict:
        """Register (or update) an experiment from a mapping or YAML text; returns its description."""
        if isinstance(config, str):
            return self._call("POST", "/experiments", content=config, headers={"Content-Type": "application/yaml"})
        return self._call("POST", "/experiments", json=dict(config))

    def experiments(self) -> list[dict]:
        """The registered experiments the token may see (name, owner, fingerprint, ``valid``, ``problem``, ...)."""
        return self._call("GET", "/experiments")

    def whoami(self) -> dict:
        """The caller as the token makes it: ``{"name": ..., "role": "admin" | "user"}``."""
        return self._call("GET", "/v1/whoami")

    def experiment_config(self, name: str) -> dict:
        """The validated configuration of an experiment (what a worker fetches once)."""
        return self._call("GET", f"/experiments/{name}/config")

    def settings(self) -> dict:
        """The manager's worker-facing settings (broker URL, report interval)."""
        return self._call("GET", "/settings")

    # sessions
    def start_session(self, experiment: str, rate: float | None = None, weight: float | None = None, *,
                      launcher: str | None = None, workers: int | None = None, follow: bool = False) -> dict:
        """Start a session of ``experiment``.

        Args:
            experiment: a registered experiment's name.
            rate: initial publish rate in tasks/s (default: the manager's).
            weight: its share of shared workers relative to other sessions (default 1).
            launcher: who runs its workers: ``none`` (someone else, the default) or ``swarm`` (a docker swarm
                service the manager creates, scales and removes).
            workers: workers the launcher starts.
            follow: follow the labels CSV: rows appended later are published too; the session runs until cancelled.

        Raises:
            ManagerError: the manager refused (unknown experiment, an active session, a Docker engine error).
        """
        body: dict[str, float | int | str | bool] = {} if rate is None else {"rate": rate}
        if follow:
            body["follow"] = True
        for key, value in (("weight", weight), ("launcher", launcher), ("workers", workers)):
            if value is not None:
                body[key] = value
        return self._call("POST", f"/experiments/{experiment}/sessions", json=body)

    def session(self, session_id: str) -> dict:
        """A session's progress."""
        return self._call("GET", f"/sessions/{session_id}")

    def sessions(self, status: str | Sequence[str] | None = None, limit: int | None = None,
                 offset: int = 0) -> list[dict]:
        """One page of sessions' progress, newest first.

        Args:
            status: only sessions in this status or these statuses (``running``, ``paused``, ``completed``,
                ``cancelled``, ``failed``); ``None``: any.
            limit: sessions per page, 1 to 1,000 (default: the manager's, 50).
            offset: sessions skipped (the next page starts at ``offset + limit``).

        Raises:
            ManagerError: the manager cannot be reached or refuses the filters (422).
        """
        params: dict[str, Any] = {"offset": offset}
        if status is not None:
            params["status"] = [status] if isinstance(status, str) else list(status)
        if limit is not None:
            params["limit"] = limit
        return self._call("GET", "/sessions", params=params)

    def set_rate(self, session_id: str, rate: float) -> dict:
        """Set a session's publish rate in tasks/s."""
        return self._call("PUT", f"/sessions/{session_id}/rate", json={"rate": rate})

    def set_weight(self, session_id: str, weight: float) -> dict:
        """Set a session's weight (its share of shared workers relative to other sessions)."""
        return self._call("PUT", f"/sessions/{session_id}/weight", json={"weight": weight})

    def set_workers(self, session_id: str, workers: int) -> dict:
        """Scale the workers of a session whose launcher the manager runs (``launcher: swarm``).

        Raises:
            ManagerError: no such session, it has ended, or its workers are not the manager's (409).
        """
        return self._call("PUT", f"/sessions/{session_id}/workers", json={"workers": workers})

    def pause(self, session_id: str) -> dict:
        return self._call("POST", f"/sessions/{session_id}/pause")

    def resume(self, session_id: str) -> dict:
        return self._call("POST", f"/sessions/{session_id}/resume")

    def cancel(self, session_id: str) -> dict:
        return self._call("POST", f"/sessions/{session_id}/cancel")

    def failures(self, session_id: str) -> list[dict]:
        """Failed samples of a session with their reasons."""
        return self._call("GET", f"/sessions/{session_id}/failures")

    # worker side
    def report(self, session_id: str, outcomes: Sequence[Mapping[str, Any]]) -> None:
        """Send a batch of sample outcomes ``{sample_id, status, reason, seconds}``."""
        self._call("POST", f"/sessions/{session_id}/outcomes", json={"outcomes": list(outcomes)})

    def redelivered(self, session_id: str, sample_id: str) -> bool:
        """Record a broker redelivery of a sample; ``False`` when it exhausted its attempts (do not run it)."""
        return bool(self._call("POST", f"/sessions/{session_id}/redeliveries", json={"sample_id": sample_id})["run"])


def _describe(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(f"{d.get('path', '')}: {d.get('reason', d)}" if isinstance(d, dict) else str(d)
                         for d in detail)
    return str(detail)


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The events of a Server-Sent Events stream (the manager's ``/v1/jobs/{id}/events`` and
    ``/sessions/{id}/events``), from its lines as ``httpx.Response.iter_lines`` gives them: ``{id, event, data}``
    with ``id`` an int and ``data`` decoded from JSON; an event is yielded at its blank line, once it has an id
    (WHATWG HTML, "Server-sent events": fields ``id``, ``event``, ``data``).

    Raises:
        json.JSONDecodeError: a ``data`` line that is not JSON.
    """
    event: dict[str, Any] = {}
    for line in lines:
        if line.startswith("id: "):
            event["id"] = int(line[4:])
        elif line.startswith("event: "):
            event["event"] = line[7:]
        elif line.startswith("data: "):
            event["data"] = json.loads(line[6:])
        elif not line and "id" in event:
            yield event
            event = {}
