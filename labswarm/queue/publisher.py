"""Publishing task messages in batches: pipelined publisher confirms on RabbitMQ, one transaction on the embedded
broker.

A batch is published whole, then every confirm is awaited at once (RabbitMQ acks several deliveries with one
``basic.ack multiple=True``), instead of one round trip per message as Celery's ``send_task`` with
``confirm_publish`` does. Messages are Celery task messages (protocol 2, built by ``app.amqp.as_task_v2``), so
Celery workers consume them unchanged.

What can happen to a published message, and what :func:`publish_confirmed` does about it:

- ``basic.ack``: the broker has it (persistent, on a durable queue): done.
- ``basic.nack``: the broker refused it, e.g. the queue is at its ``x-max-length`` with ``reject-publish``:
  back off and publish the refused messages again (back-pressure, no loss).
- ``basic.return`` (published ``mandatory``): no queue is bound (someone deleted it): declare it again, publish
  again.
- connection lost, broker down, no confirm within :data:`CONFIRM_TIMEOUT`: reconnect with backoff and publish
  every unconfirmed message again (a message confirmed but whose confirm was lost runs twice: tasks are
  idempotent).
- access refused, a queue declared with other arguments (``PRECONDITION_FAILED``), a vhost that does not exist
  or is not allowed: permanent, :class:`~labswarm.errors.PublishError` at once (naming the queue and the
  broker's reason; never the password).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amqp import exceptions as amqp_errors
from celery import Celery
from kombu import Connection, Queue
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.serialization import dumps
from sqlalchemy import select

from labswarm.errors import PublishError
from labswarm.queue.names import TASK_NAME, connection_name, embedded_lock, is_embedded

log = logging.getLogger(__name__)

#: Seconds to wait for the confirms of one batch before the connection counts as dead (reconnect, republish).
CONFIRM_TIMEOUT = 30.0
#: Seconds to open a connection to the broker.
CONNECT_TIMEOUT = 10.0
#: First and longest wait, in seconds, before publishing again after a refusal or a lost connection.
BACKOFF_START, BACKOFF_MAX = 0.05, 2.0
#: Broker errors that publishing again cannot cure (AMQP reply codes 403, 406, 530).
PERMANENT = (amqp_errors.AccessRefused, amqp_errors.PreconditionFailed, amqp_errors.NotAllowed)
#: Consecutive ``NOT_FOUND`` errors (e.g. an exchange deleted under us: declared again each time) before giving up.
MAX_NOT_FOUND = 3


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """A serialized Celery task message (protocol 2), ready for any transport."""

    task_id: str
    body: str
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    properties: dict[str, Any]


class TaskMessages:
    """Builds ``labswarm.compute`` task messages the way ``send_task`` does (``app.amqp.as_task_v2``).

    Args:
        app: the Celery app (its ``amqp`` helpers and serializer).
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.origin = f"labswarm-manager@{uuid.uuid4().hex[:8]}"

    def build(self, session_id: str, sample: dict[str, Any] | list[dict[str, Any]],
              fingerprint: str | None) -> TaskMessage:
        """The task message of one sample, args ``(session_id, sample)``, or of several, args
        ``(session_id, [sample, ...])`` (``samples_per_message`` > 1); kwargs ``{fingerprint}`` when known."""
        task_id = str(uuid.uuid4())
        kwargs = {"fingerprint": fingerprint} if fingerprint else {}
        if isinstance(sample, list):
            shown = f"[{len(sample)} samples from {sample[0].get('id') if sample else None!r}]"
        else:
            shown = repr(sample.get("id"))
        message = self.app.amqp.as_task_v2(
            task_id, TASK_NAME, args=(session_id, sample), kwargs=kwargs, ignore_result=True,
            argsrepr=f"({session_id!r}, {shown})", kwargsrepr=repr(kwargs), origin=self.origin,
        )
        content_type, content_encoding, body = dumps(message.body, serializer="json")
        properties = dict(message.properties, delivery_mode=2)
        return TaskMessage(task_id, body, content_type, content_encoding, message.headers, properties)


class ConfirmTimeout(Exception):
    """Not every confirm of a batch came within :data:`CONFIRM_TIMEOUT` (the connection is taken as dead)."""


class AmqpPublisher:
    """One connection and one channel in confirm mode, used by one thread (py-amqp is not thread-safe).

    Args:
        url: the broker URL (``amqp://...``).
        confirm_timeout: seconds to wait for a batch's confirms (default :data:`CONFIRM_TIMEOUT`).
    """

    def __init__(self, url: str, confirm_timeout: float = CONFIRM_TIMEOUT, name: str | None = None) -> None:
        self.url = url
        self.name = name  #: the connection's name in RabbitMQ (``connection_name``), if any
        self.confirm_timeout = confirm_timeout
        self._conn: Connection | None = None
        self._channel: Any = None  # py-amqp's channel (amqp is untyped)
        self._declared: set[str] = set()
        self._tag = 0  # delivery tag of the last message published on the channel
        self._first = 0  # delivery tag of the first message of the batch in flight
        self._status: list[str | None] = []
        self._low = 0  # index of the first unresolved message of the batch
        self._resolved = 0
        self._index: dict[str, int] = {}

    def _open(self) -> Connection:
        """Connect, open a channel in confirm mode and make them the publisher's; returns the connection."""
        # heartbeat 0: an idle publisher (a paused session) keeps its connection; a dead one shows on publish
        options = {"client_properties": {"connection_name": self.name}} if self.name else {}
        conn = Connection(self.url, heartbeat=0, connect_timeout=CONNECT_TIMEOUT, transport_options=options)
        try:
            conn.connect()
            channel = conn.channel()
            channel.confirm_select()
        except BaseException:
            conn.release()
            raise
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)
        self._conn, self._channel, self._tag, self._declared = conn, channel, 0, set()
        return conn

    def close(self) -> None:
        """Close the connection (the next publish opens a new one)."""
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception as exc:  # already broken: nothing to close
                log.debug("closing the publisher's connection: %s", exc)

    def forget(self, queue: Queue) -> None:
        """Declare ``queue`` again before the next publish (it was found missing)."""
        self._declared.discard(queue.name)

    def publish(self, queue: Queue, messages: Sequence[TaskMessage]) -> list[str]:
        """Publish ``messages`` to ``queue`` (declared first, once per channel) and wait for every confirm.

        Returns:
            one status per message: ``"ack"`` (the broker has it), ``"nack"`` (refused, e.g. queue full) or
            ``"returned"`` (no queue bound).

        Raises:
            ConfirmTimeout: confirms missing after ``confirm_timeout`` s.
            amqp.exceptions.AMQPError, OSError: the broker closed the channel or the connection.
        """
        conn = self._conn if self._conn is not None else self._open()
        channel = self._channel
        if queue.name not in self._declared:
            queue(channel).declare()
            self._declared.add(queue.name)
        n = len(messages)
        self._first, self._status, self._low, self._resolved = self._tag + 1, [None] * n, 0, 0
        self._index = {m.task_id: i for i, m in enumerate(messages)}
        exchange, routing_key = queue.exchange.name, queue.routing_key
        for m in messages:
            body = channel.prepare_message(m.body, None, m.content_type, m.content_encoding, m.headers,
                                           dict(m.properties))
            channel.basic_publish(body, exchange=exchange, routing_key=routing_key, mandatory=True)
            self._tag += 1
        deadline = time.monotonic() + self.confirm_timeout
        while self._resolved < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConfirmTimeout(f"{n - self._resolved} of {n} confirms missing after {self.confirm_timeout} s")
            try:
                conn.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
        return [status for status in self._status if status is not None]  # all resolved: one per message

    def _resolve(self, tag: int, multiple: bool, status: str) -> None:
        index = tag - self._first
        if index < 0 or index >= len(self._status):
            return  # a confirm of an earlier batch
        for i in range(self._low, index + 1) if multiple else (index,):
            if self._status[i] is None:
                self._status[i] = status
                self._resolved += 1
        while self._low < len(self._status) and self._status[self._low] is not None:
            self._low += 1

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._resolve(tag, multiple, "ack")

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._resolve(tag, multiple, "nack")

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        # a returned message is followed by its ack: mark it first so that the ack does not count it
        correlation_id = (message.properties or {}).get("correlation_id")
        index = self._index.get(correlation_id) if correlation_id is not None else None
        if index is not None:
            self._resolve(self._first + index, False, "returned")


class EmbeddedPublisher:
    """Publishes a batch in one transaction of kombu's SQLAlchemy transport (no confirms there: the commit is).

    Args:
        url: the embedded broker's URL (``sqla+sqlite:///...``).
        transport_options: the app's ``broker_transport_options``.
    """

    def __init__(self, url: str, transport_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.transport_options = transport_options or {}
        self._conn: Connection | None = None
        self._declared: set[str] = set()

    def close(self) -> None:
        """Close the connection (the next publish opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release()

    def forget(self, queue: Queue) -> None:
        self._declared.discard(queue.name)

    def publish(self, queue: Queue, messages: Sequence[TaskMessage]) -> list[str]:
        """Insert every message in one commit; all ``"ack"`` once committed.

        Raises:
            sqlalchemy.exc.OperationalError: the database refused (e.g. locked past its timeout); nothing is kept.
        """
        if self._conn is None:
            self._conn = Connection(self.url, transport_options=self.transport_options)
        # kombu.transport.sqlalchemy's Channel: the internals used below (_get_or_create, message_cls, session)
        # are untyped, and the connection types its default channel as the abstract base
        channel: Any = self._conn.default_channel
        if queue.name not in self._declared:
            with embedded_lock(self.url):
                queue(channel).declare()
            self._declared.add(queue.name)
        try:
            get_queue, augment, message_cls = (channel._get_or_create, channel._inplace_augment_message,
                                               channel.message_cls)
        except AttributeError:  # another kombu: one publish (and one commit) per message
            producer = self._conn.Producer(channel)
            for m in messages:
                producer.publish(m.body, exchange=queue.exchange.name, routing_key=queue.routing_key,
                                 headers=m.headers, content_type=m.content_type, content_encoding=m.content_encoding,
                                 **m.properties)
            return ["ack"] * len(messages)
        exchange, routing_key = queue.exchange.name, queue.routing_key
        session = channel.session
        table = message_cls.__table__
        try:
            # the queue's row looked up by one indexed read (kombu's ORM query of it cost ~45 % of a batch's
            # publish, py-spy on the manager at N = 1: issue 27), created by kombu when missing; the rows then
            # inserted by one executemany, as kombu's ORM would write them (visible, version 1, no timestamp)
            queue_id = session.execute(select(channel.queue_cls.id).where(channel.queue_cls.name == queue.name)
                                       ).scalar()
            if queue_id is None:
                queue_id = get_queue(queue.name).id
            rows = []
            for m in messages:
                payload = channel.prepare_message(m.body, None, m.content_type, m.content_encoding, m.headers,
                                                  dict(m.properties))
                augment(payload, exchange, routing_key)
                rows.append({"payload": json.dumps(payload), "queue_id": queue_id, "visible": True, "version": 1})
            session.execute(table.insert(), rows)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        return ["ack"] * len(messages)


def make_publisher(app: Celery, experiment: str | None = None) -> AmqpPublisher | EmbeddedPublisher:
    """The publisher for ``app``'s broker (one per publishing thread); on RabbitMQ its connection is named
    ``labswarm <app's role> publisher <experiment>`` (:func:`~labswarm.queue.names.connection_name`)."""
    url = app.conf.broker_url
    if is_embedded(url):
        return EmbeddedPublisher(url, dict(app.conf.broker_transport_options or {}))
    role = f"{app.conf.get('labswarm_role') or 'manager'} publisher"
    return AmqpPublisher(url, name=connection_name(role, experiment or app.conf.get("labswarm_experiment")))


def redacted(url: str) -> str:
    """``url`` with its password masked (``amqp://user:**@host:5672//``)."""
    try:
        return Connection(url).as_uri()
    except Exception:
        return "<broker>"


def publish_confirmed(publisher: AmqpPublisher | EmbeddedPublisher, queue: Queue, messages: Sequence[TaskMessage],
                      stop: threading.Event) -> int:
    """Publish every message until the broker has confirmed it, or ``stop`` is set.

    Refused messages (``nack``: queue full) and returned ones (no queue) are published again after a backoff
    (:data:`BACKOFF_START` doubling to :data:`BACKOFF_MAX` s); a lost connection is reopened with the same
    backoff and every unconfirmed message published again.

    Returns:
        the length of the confirmed prefix of ``messages`` (all of them unless ``stop`` was set first; messages
        after the prefix may have been confirmed too: publishing them again is harmless).

    Raises:
        PublishError: a permanent refusal (access refused, queue arguments mismatch, vhost not allowed or
            missing); the message names the queue and the broker's reason.
    """
    confirmed = [False] * len(messages)
    pending = list(range(len(messages)))
    delay, not_found = BACKOFF_START, 0
    while pending and not stop.is_set():
        try:
            statuses = publisher.publish(queue, [messages[i] for i in pending])
        except PERMANENT as exc:
            publisher.close()
            raise PublishError(queue.name, redacted(publisher.url), _reason(exc)) from exc
        except amqp_errors.NotFound as exc:
            publisher.close()
            not_found += 1
            if not_found >= MAX_NOT_FOUND:
                raise PublishError(queue.name, redacted(publisher.url), _reason(exc)) from exc
            log.warning("publishing to %s: %s; declaring again", queue.name, _reason(exc))
        except (OSError, ConfirmTimeout, amqp_errors.AMQPError, KombuOperationalError, _sqla_errors()) as exc:
            publisher.close()
            log.warning("publishing to %s failed (%s: %s); publishing again in %.2f s", queue.name,
                        type(exc).__name__, _reason(exc), delay)
        else:
            not_found = 0
            for i, status in zip(pending, statuses, strict=True):
                confirmed[i] = status == "ack"
            refused = [s for s in statuses if s != "ack"]
            pending = [i for i in pending if not confirmed[i]]
            if not pending:
                break
            if "returned" in refused:
                publisher.forget(queue)
            log.debug("%s: %d messages refused (%s); publishing again in %.2f s", queue.name, len(refused),
                      ", ".join(sorted(set(refused))), delay)
            if len(refused) < len(statuses):
                delay = BACKOFF_START  # some got through: the queue has room again
        if stop.wait(delay):
            break
        delay = min(delay * 2, BACKOFF_MAX)
    prefix = 0
    while prefix < len(confirmed) and confirmed[prefix]:
        prefix += 1
    return prefix


def _reason(exc: BaseException) -> str:
    """The broker's explanation of an error (py-amqp puts it in ``reply_text``)."""
    text = getattr(exc, "reply_text", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _sqla_errors() -> type[BaseException]:
    from sqlalchemy.exc import OperationalError

    return OperationalError
