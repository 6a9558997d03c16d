"""The embedded broker's transport: kombu's SQLAlchemy transport on SQLite, made cheap to poll and to consume.

kombu's transport (``sqla+sqlite:///...``) fetches a message in a write transaction (``BEGIN IMMEDIATE``, an ORM
``SELECT ... FOR UPDATE``, an ``UPDATE visible = 0``, a commit and its fsync) even when the queue is empty, and it
keeps every delivered message in the table (``visible = 0``), so each poll scans past all of them. Its idle
consumers poll at a fixed interval. This transport (aliased to ``sqla``/``sqlalchemy`` by
:func:`install`, which :func:`labswarm.queue.app.prepare_embedded_broker` calls) changes, on SQLite only:

- a poll is a read first (no write lock, no fsync; WAL readers do not block the writer): an empty queue costs one
  indexed ``SELECT``; a message is claimed by one ``DELETE ... RETURNING`` (atomic: two consumers never get one
  message) instead of being kept invisible. Nothing read the invisible rows: kombu gives an unacknowledged message
  back by inserting it again, and a killed worker's message is republished by the session's ledger, as before;
- an index on ``(queue_id, visible, timestamp, id)``, the order kombu delivers in;
- ``PRAGMA synchronous=NORMAL`` on each connection (the file is in WAL mode): a commit survives the kill of any
  process (``kill -9``: what the README's guarantee is about), not a power loss or an OS crash, which may lose the
  last commits (messages the ledger then republishes, as it does a killed worker's: the ledger's own database is
  not this file);
- adaptive polling: a consumer polls every :data:`POLL_FAST` s while messages come, and after
  :data:`FAST_EMPTY_POLLS` empty polls in a row backs off, doubling, to at most :data:`POLL_MAX` s, so an idle
  worker costs ~10 queries/s instead of 200. A message published while a consumer is backed off waits at most
  :data:`POLL_MAX` s. A consumer that holds its prefetch count of tasks does not poll: it waits for one of its
  acks (woken at once, :attr:`Transport.room`) instead of looping every :data:`POLL_FAST` s as kombu does.

Other databases (``sqla+postgresql://...``) keep kombu's behaviour, with the adaptive polling.
"""

from __future__ import annotations

import threading
from json import loads
from queue import Empty
from time import monotonic, sleep
from typing import Any, ClassVar

from kombu.transport import sqlalchemy as sqla
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from sqlalchemy import event, text

#: Seconds between polls while messages come (and after a consumer's first empty polls): bounds the wait of a
#: worker that has just acked its task for the next one. Also ``labswarm.queue.app.EMBEDDED_POLLING_INTERVAL``.
POLL_FAST = 0.005
#: Empty polls in a row (~25 ms at :data:`POLL_FAST`) before a consumer starts backing off.
FAST_EMPTY_POLLS = 5
#: The longest interval between polls of an idle consumer (s): the most a message published to an idle queue
#: waits for a backed-off consumer; ~10 queries/s per idle worker process.
POLL_MAX = 0.1
#: The index the claim query uses (created once per broker file, idempotent).
INDEX_NAME = "ix_labswarm_message_queue_visible"


def poll_interval(empty_polls: int) -> float:
    """Seconds to wait after ``empty_polls`` empty polls in a row (0: a message just came).

    :data:`POLL_FAST` for the first :data:`FAST_EMPTY_POLLS`, then doubling up to :data:`POLL_MAX`.

    Raises:
        ValueError: ``empty_polls`` is negative.
    """
    if empty_polls < 0:
        raise ValueError(f"empty_polls must be >= 0, got {empty_polls}")
    if empty_polls <= FAST_EMPTY_POLLS:
        return POLL_FAST
    return min(POLL_MAX, POLL_FAST * 2.0 ** min(empty_polls - FAST_EMPTY_POLLS, 32))


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


class QoS(virtual.QoS):
    """kombu's prefetch accounting; an ack or a reject wakes the transport's consumer loop (there is room)."""

    def ack(self, delivery_tag: Any) -> None:
        super().ack(delivery_tag)
        self._room()

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        super().reject(delivery_tag, requeue=requeue)
        self._room()

    def _room(self) -> None:
        room = getattr(getattr(self.channel, "connection", None), "room", None)
        if room is not None:
            room.set()


class Channel(sqla.Channel):
    """kombu's SQLAlchemy channel with a read-first claim on SQLite (see the module docstring)."""

    QoS = QoS

    # not kombu's cache: its engines lack the pragmas and the index. kombu's Channel declares its own cache a
    # plain class attribute, which mypy takes for an instance variable: overriding it with a ClassVar is flagged
    _engines: ClassVar[dict[str, Any]] = {}  # type: ignore[misc]  # kombu's class-level cache lacks ClassVar

    def _engine_from_config(self):
        engine = super()._engine_from_config()
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        return engine

    def _open(self):
        new = self.connection.client.hostname not in self._engines
        engine, session_cls = super()._open()
        if new and engine.dialect.name == "sqlite":
            with engine.begin() as conn:
                conn.execute(text(f"CREATE INDEX IF NOT EXISTS {INDEX_NAME} ON {self.message_tablename} "
                                  "(queue_id, visible, timestamp, id)"))
        return engine, session_cls

    def _queue_id(self, queue: str) -> int:
        ids = self.__dict__.setdefault("_queue_ids", {})
        if queue not in ids:
            ids[queue] = self._get_or_create(queue).id
            self.session.commit()
        return ids[queue]

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        # ``timeout``: in kombu's abstract signature; its virtual channel never passes one (it polls)
        if self.session.bind.name != "sqlite":
            try:
                payload = super()._get(queue)
            except Empty:
                self.connection.polled(False)
                raise
            self.connection.polled(True)
            return payload
        table = self.message_tablename
        queue_id = self._queue_id(queue)
        session = self.session
        try:
            # the read: no lock taken in WAL mode, no fsync (pysqlite opens no transaction for a SELECT)
            row = session.execute(
                text(f"SELECT id FROM {table} WHERE queue_id = :q AND visible = 1 ORDER BY timestamp, id LIMIT 1"),
                {"q": queue_id}).first()
            session.commit()
            if row is None:
                self.connection.polled(False)
                raise Empty()
            # the claim: one statement in its own write transaction; another consumer may have taken the row
            # since the read: then the oldest visible one, or none
            claimed = session.execute(
                text(f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} WHERE queue_id = :q AND visible = 1 "
                     "ORDER BY timestamp, id LIMIT 1) RETURNING payload"), {"q": queue_id}).first()
            session.commit()
        except BaseException:
            session.rollback()
            raise
        if claimed is None:
            self.connection.polled(False)
            raise Empty()
        self.connection.polled(True)
        return loads(bytes_to_str(claimed[0]))


class Transport(sqla.Transport):
    """kombu's SQLAlchemy transport with :class:`Channel` and adaptive polling (:func:`poll_interval`)."""

    Channel = Channel
    polling_interval = POLL_FAST

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        #: Empty polls in a row (0 after a message).
        self.empty_polls = 0
        #: Polls of the database so far.
        self.polls = 0
        #: Set when a consumer acks or rejects a message (room for another under its prefetch count).
        self.room = threading.Event()

    def polled(self, got: bool) -> None:
        """Record a poll of the database: ``got`` a message or found the queue empty."""
        self.polls += 1
        self.empty_polls = 0 if got else self.empty_polls + 1

    def drain_events(  # type: ignore[override]  # kombu's virtual Transport, the parent, narrows base's **kwargs
        self, connection: Any, timeout: float | None = None,
    ) -> None:
        """kombu's virtual ``drain_events`` with the interval of :func:`poll_interval` between empty rounds.

        A round that polled no queue (each consumer holds its prefetch count of unacknowledged messages) waits
        for an ack or a reject (:attr:`room`), at most :data:`POLL_MAX` s, instead of looping every
        :data:`POLL_FAST` s: the next message is fetched as soon as there is room for it.

        Raises:
            TimeoutError: no message came within ``timeout`` s.
        """
        start = monotonic()
        cycle: Any = self.cycle  # kombu's FairCycle, set in __init__ (the class declares it None)
        get = cycle.get
        while True:
            polls = self.polls
            self.room.clear()
            try:
                get(self._deliver, timeout=timeout)
            except Empty:
                full = self.polls == polls  # no queue polled: no room under the prefetch count
                interval = POLL_MAX if full else poll_interval(self.empty_polls)
                if timeout is not None:
                    left = timeout - (monotonic() - start)
                    if left <= 0:
                        raise TimeoutError() from None
                    interval = min(interval, left)
                if full:
                    self.room.wait(interval)
                else:
                    sleep(interval)
            else:
                return


def install() -> None:
    """Make ``sqla+`` and ``sqlalchemy+`` broker URLs use :class:`Transport` in this process (idempotent)."""
    from kombu import transport

    for alias in ("sqla", "sqlalchemy"):
        transport.TRANSPORT_ALIASES[alias] = "labswarm.queue.embedded:Transport"
        transport._transport_cache.pop(alias, None)
