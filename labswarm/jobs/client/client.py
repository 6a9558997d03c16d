"""A client of the training-jobs API (``/v1/jobs``) for the CLI, ``labswarm run`` and scripts (httpx).

Its event reader follows a job's Server-Sent Events and reconnects with ``Last-Event-ID`` when the connection
drops, so a caller sees every event once, in order, until the job is completed or failed.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from labswarm.client import HTTPClient, parse_sse, raise_for_status
from labswarm.errors import ManagerError

log = logging.getLogger(__name__)

#: The statuses after which a job's stream ends.
TERMINAL = ("completed", "failed")


class JobsClient(HTTPClient):
    """Calls the manager's ``/v1/jobs`` routes; every error becomes a :class:`~labswarm.errors.ManagerError`
    (``status`` and ``detail`` set from the answer: a 422's ``detail`` lists each invalid field's path).

    Args:
        url: the manager's base URL.
        token: the API token, sent as ``Authorization: Bearer``.
        timeout: seconds per request (the event stream waits without limit between events).
        transport: an httpx transport (tests).
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(url, token, timeout, transport)

    def submit(self, manifest: Mapping[str, Any] | str | Path, *, reuse: bool = False) -> dict[str, Any]:
        """Submit a job (a mapping, YAML text, or a manifest file: its relative paths are relative to it);
        returns the job as the manager shows it. With ``reuse``, a completed job of the same configuration, data
        and code is returned instead when there is one (``"reused": true``; nothing is queued).

        Raises:
            ConfigError: the manifest file is invalid.
            ManagerError: the manager refused it (422: ``detail`` names each field) or cannot be reached.
        """
        return self._call("POST", "/v1/jobs", params={"reuse": "true"} if reuse else None, **_body(manifest))

    def validate(self, manifest: Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """Check a manifest without creating a job: ``{"valid": true, "manifest": resolved}``."""
        return self._call("POST", "/v1/jobs/validate", **_body(manifest))

    def list(self, *, status: list[str] | None = None, name: str | None = None, offset: int = 0,
             limit: int = 50) -> dict[str, Any]:
        """A page of jobs: ``{jobs, total, offset, limit}``."""
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        if status:
            params["status"] = status
        if name:
            params["name"] = name
        return self._call("GET", "/v1/jobs", params=params)

    def show(self, job_id: str) -> dict[str, Any]:
        """One job."""
        return self._call("GET", f"/v1/jobs/{job_id}")

    def halt(self, job_id: str) -> dict[str, Any]:
        """Halt a job (cooperatively)."""
        return self._call("PATCH", f"/v1/jobs/{job_id}", json={"status": "halt"})

    def resume(self, job_id: str) -> dict[str, Any]:
        """Resume a halted job from its checkpoint."""
        return self._call("PATCH", f"/v1/jobs/{job_id}", json={"status": "resume"})

    def change_training(self, job_id: str, training: dict[str, Any]) -> dict[str, Any]:
        """Change a running job's training live (``{"learning_rate": ..., "early_stopping": {"patience": ...}}``):
        the manager's ``change`` event, with ``from_epoch`` (the epoch from whose start every learner applies it)."""
        return self._call("PATCH", f"/v1/jobs/{job_id}", json={"training": training})

    def delete(self, job_id: str) -> None:
        """Delete a job and what it owns."""
        self._call("DELETE", f"/v1/jobs/{job_id}")

    def attempts(self, job_id: str) -> builtins.list[dict[str, Any]]:  # builtins: `list` is the method above
        """The job's attempts."""
        return self._call("GET", f"/v1/jobs/{job_id}/attempts")["attempts"]

    def logs(self, job_id: str, *, pos: int = 0, pagesize: int = 1000) -> Iterator[dict[str, Any]]:
        """Every log line stored so far, page after page."""
        while True:
            page = self._call("GET", f"/v1/jobs/{job_id}/logs", params={"pos": pos, "pagesize": pagesize})
            yield from page["lines"]
            if len(page["lines"]) < pagesize:
                return
            pos = page["next_pos"]

    def metrics(self, job_id: str) -> builtins.list[dict[str, Any]]:
        """The job's metrics records."""
        return self._call("GET", f"/v1/jobs/{job_id}/metrics")["metrics"]

    def download_model(self, job_id: str, path: str | Path) -> Path:
        """Download the trained model to ``path``."""
        return self._download(f"/v1/jobs/{job_id}/model", Path(path), job_id)

    def download_bundle(self, job_id: str, path: str | Path) -> Path:
        """Download the job's bundle (a zip: model, logs, metrics, manifest, versions) to ``path``."""
        return self._download(f"/v1/jobs/{job_id}/bundle", Path(path), job_id)

    def _download(self, route: str, path: Path, job_id: str) -> Path:
        try:
            with self._http.stream("GET", route) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for_status(response, "GET", route)
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as handle:
                    for chunk in response.iter_bytes(1 << 20):
                        handle.write(chunk)
        except httpx.HTTPError as exc:
            raise ManagerError(f"cannot download {route} of job {job_id}: {exc}") from exc
        return path

    def events(self, job_id: str, *, after: int = 0, reconnect_s: float = 1.0,
               give_up_s: float = 60.0) -> Iterator[dict[str, Any]]:
        """The job's events from after sequence number ``after`` on, as ``{id, event, data}``, until its
        terminal status. A dropped connection is resumed with ``Last-Event-ID``: no event is missed or repeated.

        Raises:
            ManagerError: the job is unknown, or the manager stayed unreachable for ``give_up_s`` seconds.
        """
        last, failing_since = after, None
        while True:
            try:
                with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(10, read=None),
                                       headers={"Last-Event-ID": str(last)}) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise_for_status(response, "GET", f"/v1/jobs/{job_id}/events")
                    if response.status_code == 204:
                        return  # the job is over and every event up to its terminal status was sent
                    failing_since = None
                    for event in parse_sse(response.iter_lines()):
                        last = event["id"]
                        yield event
                        if event["event"] == "status" and event["data"].get("status") in TERMINAL:
                            return
            except httpx.HTTPError as exc:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > give_up_s:
                    raise ManagerError(f"lost the event stream of job {job_id}: {exc}") from exc
                log.info("event stream of job %s interrupted (%s): reconnecting after event %d", job_id, exc, last)
                time.sleep(reconnect_s)
                continue
            # the server ended the stream without a terminal status (it restarted): read on from where we are
            time.sleep(reconnect_s)


def _body(manifest: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(manifest, Path):  # validated here, its relative paths made absolute against its folder
        from labswarm.config.manifest import load_manifest

        return {"json": load_manifest(manifest).model_dump(mode="json")}
    if isinstance(manifest, str):
        return {"content": manifest.encode(), "headers": {"Content-Type": "application/yaml"}}
    return {"json": dict(manifest)}


