"""``labswarm run``'s loops reading its own manager in-process (labswarm.run.direct, issue 27): a real manager over
real HTTP with a real RabbitMQ, two sessions (one running, one paused; a third ended), and what the progress wait
and the health loop read and set in-process against the same over HTTP (``ManagerClient``, ``ManagerMonitor``)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import delete_queue, experiment_dict

from labswarm.client import ManagerClient
from labswarm.errors import ManagerError
from labswarm.health.monitors import ManagerMonitor
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.app import queue_name
from labswarm.run.direct import ServiceMonitor, ServiceProgress
from labswarm.settings import Settings

TOKEN = "the-run's-own-t0ken"
MOVING = ("elapsed_s", "samples_per_s")  # read at another instant


def _still(progress: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in progress.items() if k not in MOVING}


def test_in_process_reads_and_rates_are_the_routes(tmp_path: Path, tone_dataset: Path) -> None:
    app = create_app(Settings(home=tmp_path / "home", api_token=TOKEN))
    names = [f"direct-{uuid.uuid4().hex[:8]}" for _ in range(3)]  # queues are global on the shared broker
    try:
        with EmbeddedServer(app) as server, ManagerClient(server.url, TOKEN) as client:
            ids = []
            for name in names:
                client.post_experiment(experiment_dict(tone_dataset, tmp_path / name, name=name))
                ids.append(client.start_session(name, 0.01)["id"])  # one sample every 100 s: nothing moves
            client.pause(ids[1])
            client.cancel(ids[2])
            progress, monitor = ServiceProgress(app.state.sessions), ServiceMonitor(app.state.sessions)
            http = ManagerMonitor(server.url, TOKEN)

            async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
                try:
                    return await monitor.sessions(), await http.sessions()
                finally:
                    await http.aclose()

            for sid in ids:  # the progress wait's read: the route's JSON (times as ISO strings)
                assert _still(progress.session(sid)) == _still(client.session(sid))
                assert isinstance(progress.session(sid)["created_at"], str)
            direct, routed = asyncio.run(both())  # the health loop's: the active ones, newest first
            assert [s["id"] for s in direct] == [ids[1], ids[0]]
            assert [_still(s) for s in direct] == [_still(s) for s in routed]

            asyncio.run(monitor.set_rate(ids[0], 7.5))
            assert client.session(ids[0])["rate"] == 7.5
            refused = ((ids[2], 1.0, "is cancelled"), (ids[0], 0.0, "rate must be"), ("no-such", 1.0, "NotFound"))
            for sid, rate, why in refused:
                with pytest.raises(ManagerError, match=why):
                    asyncio.run(monitor.set_rate(sid, rate))
            with pytest.raises(ManagerError, match="no-such"):
                progress.session("no-such")
            assert asyncio.run(monitor.user_weights()) is None
            client.cancel(ids[0])
            client.cancel(ids[1])
    finally:
        for name in names:
            delete_queue(app.state.sessions.settings.broker_url, queue_name(name))
