"""The AMQP heartbeat of the Celery apps' RabbitMQ connections is the setting ``broker_heartbeat`` (issue 22: it
was fixed at 30 s): what the connection negotiates with the real broker is read back from RabbitMQ's management
API (its ``timeout`` column), for a value of the setting, for 0 (off) and for the default; a negative value is
refused naming the setting."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from pydantic import ValidationError

from labswarm.errors import ConfigError
from labswarm.queue.app import DEFAULT_HEARTBEAT, make_celery
from labswarm.queue.names import connection_name
from labswarm.settings import Settings

#: The local RabbitMQ's management API (the same node as ``rabbitmq_url``).
MANAGEMENT = "http://127.0.0.1:15672"


def _negotiated(name: str, timeout: float = 10.0) -> int:
    """The heartbeat timeout (s) of the broker's connection named ``name``, once the broker lists it."""
    deadline = time.monotonic() + timeout
    while True:
        rows = httpx.get(f"{MANAGEMENT}/api/connections", auth=("guest", "guest"), timeout=5,
                         params={"columns": "client_properties.connection_name,timeout"}).json()
        found = [r["timeout"] for r in rows if (r.get("client_properties") or {}).get("connection_name") == name]
        if found:
            return int(found[0])
        if time.monotonic() > deadline:
            raise AssertionError(f"no connection named {name!r} within {timeout} s")
        time.sleep(0.1)


def _heartbeat_of(rabbitmq_url: str, settings: Settings) -> int:
    """Open a worker app's consuming connection as Celery's worker does (its consumer, with the prefork pool's
    event loop, asks ``broker_heartbeat``: celery/worker/consumer/consumer.py); what the broker negotiated."""
    experiment = f"heartbeat-{uuid.uuid4().hex[:8]}"
    app = make_celery(rabbitmq_url, role="worker", experiment=experiment, heartbeat=settings.broker_heartbeat)
    try:
        with app.connection_for_read(heartbeat=app.conf.broker_heartbeat) as conn:
            conn.connect()
            return _negotiated(connection_name("worker", experiment))
    finally:
        app.close()


def test_the_connection_negotiates_the_heartbeat_of_the_setting(rabbitmq_url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABSWARM_BROKER_HEARTBEAT", "7")
    assert _heartbeat_of(rabbitmq_url, Settings()) == 7
    assert _heartbeat_of(rabbitmq_url, Settings(broker_heartbeat=0)) == 0  # off
    monkeypatch.delenv("LABSWARM_BROKER_HEARTBEAT")
    assert Settings().broker_heartbeat == DEFAULT_HEARTBEAT == 30
    assert _heartbeat_of(rabbitmq_url, Settings()) == 30


def test_a_negative_heartbeat_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABSWARM_BROKER_HEARTBEAT", "-1")
    with pytest.raises(ValidationError, match="broker_heartbeat"):
        Settings()
    with pytest.raises(ConfigError, match="broker_heartbeat"):
        make_celery("amqp://guest:guest@127.0.0.1:5672//", heartbeat=-5)
