"""The log records and errors of a failing publish never carry the broker's password (a real RabbitMQ refusing
the login, and a broker that is not there)."""

from __future__ import annotations

import logging
import threading

import pytest

from labswarm.errors import PublishError
from labswarm.queue.app import app_queue, make_celery
from labswarm.queue.publisher import TaskMessages, make_publisher, publish_confirmed

PASSWORD = "s3cr3t-pw"


def _publish_once(url: str, caplog: pytest.LogCaptureFixture) -> tuple[int | None, PublishError | None]:
    """Publish one message to ``url`` until a permanent error, or until the first warning (a retry)."""
    app = make_celery(url)
    stop = threading.Event()

    class StopOnWarning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                stop.set()

    handler = StopOnWarning()
    logger = logging.getLogger("labswarm.queue.publisher")
    logger.addHandler(handler)
    publisher = make_publisher(app)
    try:
        with caplog.at_level(logging.DEBUG):
            confirmed = publish_confirmed(publisher, app_queue(app, "secrets-test"),
                                          [TaskMessages(app).build("s", {"id": "x"}, None)], stop)
            return confirmed, None
    except PublishError as exc:
        return None, exc
    finally:
        logger.removeHandler(handler)
        publisher.close()


def test_a_refused_login_names_no_password(rabbitmq_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The real RabbitMQ refuses the login: a permanent PublishError, whose message masks the password."""
    host = rabbitmq_url.rpartition("@")[2]
    confirmed, error = _publish_once(f"amqp://guest:{PASSWORD}@{host}", caplog)
    assert error is not None, confirmed
    assert "guest:**@" in str(error) and PASSWORD not in str(error)  # masked (kombu masks with **)
    assert PASSWORD not in caplog.text and all(PASSWORD not in r.getMessage() for r in caplog.records)


def test_a_failing_connection_logs_no_password(caplog: pytest.LogCaptureFixture) -> None:
    confirmed, error = _publish_once(f"amqp://guest:{PASSWORD}@127.0.0.1:9//", caplog)  # nothing listens on 9
    assert error is None and confirmed == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings and PASSWORD not in caplog.text
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)
