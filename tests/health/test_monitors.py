"""The health loop's broker monitor on the real RabbitMQ management API: a running session's queue read alone (one
request for it, not the vhost's whole list, which the broker builds for every queue it keeps), a queue not there
left out, and many sessions' queues read from the list in one request."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import quote

import httpx
from helpers import delete_queue, missing, wait_until

from labswarm.health.monitors import FEW_QUEUES, RabbitMQMonitor

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
API = "http://127.0.0.1:15672"
AUTH = ("guest", "guest")


def test_a_few_queues_are_read_one_by_one_and_many_from_the_list() -> None:
    try:
        httpx.get(f"{API}/api/overview", auth=AUTH, timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        missing(f"RabbitMQ's management API is not reachable at {API}: {exc}")
    name, absent = f"labswarm.monitor-{uuid.uuid4().hex[:8]}", f"labswarm.monitor-{uuid.uuid4().hex[:8]}"
    queue_url = f"{API}/api/queues/%2F/{quote(name, safe='')}"
    httpx.put(queue_url, json={"durable": False, "auto_delete": False}, auth=AUTH, timeout=10).raise_for_status()
    try:
        for i in range(3):
            httpx.post(f"{API}/api/exchanges/%2F/amq.default/publish", auth=AUTH, timeout=10, json={
                "properties": {}, "routing_key": name, "payload": str(i), "payload_encoding": "string"},
            ).raise_for_status()
        # the management API's statistics refresh every ~5 s: wait until the queue shows its 3 messages
        wait_until(lambda: httpx.get(queue_url, auth=AUTH, timeout=10).json().get("messages_ready") == 3,
                   "the queue's statistics to show 3 messages ready", timeout=60)
        paths: list[str] = []

        async def hook(request: httpx.Request) -> None:
            paths.append(request.url.raw_path.decode().split("?")[0])

        async def polls() -> tuple[dict, list[str], dict, list[str]]:
            client = httpx.AsyncClient(auth=AUTH, timeout=10, event_hooks={"request": [hook]})
            monitor = RabbitMQMonitor(API, client=client)
            try:
                few = await monitor.poll({name, absent})
                few_paths = paths[:]
                paths.clear()
                many = await monitor.poll({name, *(f"labswarm.other-{i}" for i in range(FEW_QUEUES))})
                return few, few_paths, many, paths[:]
            finally:
                await monitor.aclose()

        few, few_paths, many, many_paths = asyncio.run(polls())
        assert set(few) == {name}  # the absent queue left out, no other queue read
        assert (few[name].ready, few[name].consumers) == (3, 0)
        assert sorted(few_paths) == sorted(f"/api/queues/%2F/{q}" for q in (name, absent))  # no list asked
        assert many_paths == ["/api/queues/%2F"]  # more than FEW_QUEUES: the list, in one request
        assert many[name].ready == 3 and all(q.startswith("labswarm.") for q in many)
    finally:
        delete_queue(BROKER, name)
