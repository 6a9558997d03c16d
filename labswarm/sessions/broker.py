"""The sessions' broker client: declare, publish to, measure and purge the experiments' queues (Celery/kombu).

Publishing goes through :mod:`labswarm.queue.publisher`: one long-lived connection per publishing thread (each
session's runner publishes from its own thread), a batch published whole and its confirms awaited together.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.errors import BrokerError
from labswarm.queue.app import app_queue, declare_queue, make_celery, message_bound, queue_name
from labswarm.queue.publisher import AmqpPublisher, EmbeddedPublisher, TaskMessages, make_publisher, publish_confirmed
from labswarm.redact import redact_text, redact_url
from labswarm.sample import Sample
from labswarm.settings import Settings

log = logging.getLogger(__name__)

#: Session fingerprints kept in memory (one database read per session otherwise).
FINGERPRINTS_CACHED = 1024
#: The fields of a sample's message form (:meth:`Sample.to_dict` without its deep copy: ~5x faster).
_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(Sample))


def _sample_dict(sample: Sample) -> dict:
    return {name: getattr(sample, name) for name in _SAMPLE_FIELDS}


class BrokerClient:
    """Publishes the sessions' task messages; declares, measures and purges queues through a Celery app.

    Args:
        settings: runtime settings (broker URL, queue bound).
        db: a factory of database sessions, to read a session's configuration fingerprint (carried by each of
            its messages, checked by workers); ``None``: messages carry no fingerprint.

    Thread safety: any thread may call any method; each publishing thread gets its own broker connection.
    """

    def __init__(self, settings: Settings, db: Callable[[], AbstractContextManager[Session]] | None = None) -> None:
        self.url = settings.resolved_broker_url()
        # the queue bound in messages: samples / the fixed samples per message; messages when the publisher chooses
        self.celery = make_celery(self.url, message_bound(settings.max_queue_length, settings.samples_per_message or 1),
                                  heartbeat=settings.broker_heartbeat)
        self.messages = TaskMessages(self.celery)
        #: samples per message when the caller does not say (a fixed ``samples_per_message``, else 1)
        self.samples_per_message = settings.samples_per_message or 1
        self._db = db
        self._fingerprints: OrderedDict[str, str | None] = OrderedDict()
        self._local = threading.local()
        self._publishers: dict[int, tuple[threading.Thread, AmqpPublisher | EmbeddedPublisher]] = {}
        self._lock = threading.Lock()

    def declare_queue(self, experiment: str) -> None:
        """Declare the experiment's durable queue (idempotent).

        Raises:
            BrokerError: the broker refused the connection (e.g. ``ACCESS_REFUSED``: a wrong password) or could
                not be reached; the message masks the password.
        """
        import amqp.exceptions
        import kombu.exceptions

        try:
            declare_queue(self.celery, experiment)
        except (amqp.exceptions.AMQPError, kombu.exceptions.OperationalError, OSError) as exc:
            url = self.celery.conf.broker_url
            reason = redact_text(str(exc))
            if password := urlsplit(url).password:
                reason = reason.replace(password, "***")
            raise BrokerError(f"the broker {redact_url(url)} refused the connection or could not be reached "
                              f"(declaring queue {queue_name(experiment)}): {type(exc).__name__}: {reason}") from None

    def publish(self, session_id: str, experiment: str, sample: Sample, stop: threading.Event) -> bool:
        """Publish one task (see :meth:`publish_many`); ``False`` if stopped first.

        Raises:
            PublishError: the broker refuses for good.
        """
        return self.publish_many(session_id, experiment, [sample], stop) == 1

    def publish_many(self, session_id: str, experiment: str, samples: Sequence[Sample],
                     stop: threading.Event, *, fingerprint: str | None = None, per_message: int | None = None) -> int:
        """Publish the tasks of ``samples`` and wait until the broker has confirmed them all.

        One message per sample, ``(session_id, sample)``, with N = ``per_message`` (else
        :attr:`samples_per_message`) 1; with N > 1, one message per N consecutive samples, ``(session_id, [sample,
        ...])`` (the last one may hold fewer). The batch is published whole, then its confirms are awaited together
        (pipelined). Messages the broker refuses (queue at its ``x-max-length``) are published again after a
        backoff; a lost connection is reopened with backoff (0.05 s doubling to 2 s) and the unconfirmed messages
        published again. Each message carries the session's configuration fingerprint (``fingerprint``, else the
        session row's).

        Args:
            session_id: the session the samples belong to.
            experiment: the experiment (its queue is ``labswarm.<experiment>``).
            samples: the samples to publish, any number (a batch of ~200 is typical).
            stop: set to give up waiting (broker down, queue full).
            per_message: samples per message (the publisher's choice, :mod:`labswarm.sessions.packing`).

        Returns:
            how many samples were confirmed, a prefix of ``samples`` (whole messages): fewer than all only when
            ``stop`` was set first.

        Raises:
            PublishError: access refused, queue arguments mismatch, vhost missing or not allowed (permanent).
        """
        if not samples:
            return 0
        fingerprint = fingerprint or self.fingerprint(session_id)
        n = per_message or self.samples_per_message
        if n == 1:
            messages = [self.messages.build(session_id, _sample_dict(s), fingerprint) for s in samples]
            return publish_confirmed(self._publisher(experiment), app_queue(self.celery, experiment), messages, stop)
        groups = [samples[i:i + n] for i in range(0, len(samples), n)]
        messages = [self.messages.build(session_id, [_sample_dict(s) for s in group], fingerprint)
                    for group in groups]
        confirmed = publish_confirmed(self._publisher(experiment), app_queue(self.celery, experiment), messages, stop)
        return sum(len(group) for group in groups[:confirmed])

    def fingerprint(self, session_id: str) -> str | None:
        """The configuration fingerprint of a session (``SessionRow.fingerprint``), ``None`` without a database."""
        with self._lock:
            if session_id in self._fingerprints:
                return self._fingerprints[session_id]
        if self._db is None:
            return None
        from labswarm.sessions.models import SessionRow

        with self._db() as db:
            value = db.scalar(select(SessionRow.fingerprint).where(SessionRow.id == session_id))
        with self._lock:
            self._fingerprints[session_id] = value
            while len(self._fingerprints) > FINGERPRINTS_CACHED:
                self._fingerprints.popitem(last=False)
        return value

    def _publisher(self, experiment: str) -> AmqpPublisher | EmbeddedPublisher:
        """This thread's publisher (its connection named after ``experiment``: a session's thread publishes one
        experiment's samples); the connections of threads that ended are closed on the way."""
        publisher = getattr(self._local, "publisher", None)
        if publisher is None:
            publisher = self._local.publisher = make_publisher(self.celery, experiment)
            with self._lock:
                for ident, (thread, old) in list(self._publishers.items()):
                    if not thread.is_alive():
                        old.close()
                        del self._publishers[ident]
                self._publishers[threading.get_ident()] = (threading.current_thread(), publisher)
        return publisher

    def close(self) -> None:
        """Close every broker connection: the publishing threads' and the Celery app's pool (a later call opens
        new ones)."""
        with self._lock:
            publishers, self._publishers = list(self._publishers.values()), {}
        for _, publisher in publishers:
            publisher.close()
        self.celery.close()

    def queue_depth(self, experiment: str) -> int | None:
        """Ready messages in the experiment's queue, or ``None`` when the broker cannot be asked."""
        try:
            with self.celery.connection_for_read() as conn:
                ok = conn.default_channel.queue_declare(queue=queue_name(experiment), passive=True)
                return int(ok.message_count)
        except Exception as exc:
            log.debug("queue depth of %s unknown: %s", experiment, exc)
            return None

    def purge_queue(self, experiment: str) -> None:
        """Drop every ready message of the experiment's queue (a cancelled or failed session); logs failures."""
        try:
            with self.celery.connection_for_write() as conn:
                conn.default_channel.queue_purge(queue_name(experiment))
        except Exception as exc:
            log.warning("cannot purge the queue of %s: %s", experiment, exc)
