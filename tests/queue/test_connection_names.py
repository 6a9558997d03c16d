"""Every broker connection labswarm opens carries a name (AMQP client property ``connection_name``): RabbitMQ's
management API (and UI) shows role, experiment, host and pid instead of an anonymous ``127.0.0.1:41234 -> ...``."""

from __future__ import annotations

import time

import httpx

from labswarm.queue.app import make_celery
from labswarm.queue.names import connection_name
from labswarm.queue.publisher import make_publisher

#: The local RabbitMQ's management API (the same node as ``rabbitmq_url``).
MANAGEMENT = "http://127.0.0.1:15672"


def _names(timeout: float = 10.0, expect: set[str] | None = None) -> set[str]:
    """The ``connection_name`` of every connection the broker lists, once ``expect`` are all among them."""
    deadline = time.monotonic() + timeout
    while True:
        rows = httpx.get(f"{MANAGEMENT}/api/connections", auth=("guest", "guest"), timeout=5,
                         params={"columns": "client_properties.connection_name"}).json()
        names = {(r.get("client_properties") or {}).get("connection_name") for r in rows} - {None}
        if expect is None or expect <= names or time.monotonic() > deadline:
            return names
        time.sleep(0.1)


def test_the_app_and_its_publisher_name_their_connections(rabbitmq_url: str) -> None:
    app = make_celery(rabbitmq_url, role="worker", experiment="names")
    publisher = make_publisher(app)
    try:
        with app.connection_for_write() as conn:
            conn.connect()
            publisher._open()
            wanted = {connection_name("worker", "names"), connection_name("worker publisher", "names")}
            seen = _names(expect=wanted)
    finally:
        publisher.close()
        app.close()
    assert wanted <= seen, seen
    assert connection_name("worker", "names").startswith("labswarm worker names on ")
    assert make_celery(rabbitmq_url).conf.broker_transport_options["client_properties"] == {
        "connection_name": connection_name("manager")}
