"""labswarm's embedded-broker transport (labswarm.queue.embedded): adaptive polling within its bounds, messages
published while a consumer is backed off still consumed, each message claimed by exactly one consumer, an
unacknowledged message given back, the broker file's pragmas and index. Real SQLite files, real processes."""

from __future__ import annotations

import contextlib
import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest
from kombu import Connection, Consumer, Producer

from labswarm.queue import embedded
from labswarm.queue.app import declare_queue, experiment_queue, make_celery, prepare_embedded_broker


def _url(tmp_path: Path) -> str:
    url = f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}"
    prepare_embedded_broker(url)
    return url


def _publish(url: str, bodies: list[int]) -> None:
    with Connection(url) as conn:
        producer = Producer(conn.default_channel)
        queue = experiment_queue("t")
        for body in bodies:
            producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue],
                             serializer="json")


def _consume(url: str, limit: float, received: list, ack: bool = True, count=None, total: int = 0,
             on_first=None) -> Connection:
    """Consume for ``limit`` s, or until the shared ``count`` reaches ``total``; ``on_first()`` runs inside the
    callback of the first message (a consumer blocked there claims nothing more meanwhile)."""
    conn = Connection(url)
    queue = experiment_queue("t")

    def on_message(body, message) -> None:
        if on_first is not None and not received:
            on_first()
        received.append(body)
        if ack:
            message.ack()
        if count is not None:
            with count.get_lock():
                count.value += 1

    consumer = Consumer(conn.default_channel, queues=[queue], callbacks=[on_message], accept=["json"])
    consumer.consume()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and (count is None or count.value < total):
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.5)
    return conn


def test_poll_interval_bounds() -> None:
    intervals = [embedded.poll_interval(n) for n in range(60)]
    assert intervals[0] == embedded.POLL_FAST  # a message just came
    assert intervals[: embedded.FAST_EMPTY_POLLS + 1] == [embedded.POLL_FAST] * (embedded.FAST_EMPTY_POLLS + 1)
    assert intervals == sorted(intervals)
    assert max(intervals) == embedded.POLL_MAX and intervals[-1] == embedded.POLL_MAX
    assert embedded.poll_interval(10**9) == embedded.POLL_MAX
    with pytest.raises(ValueError, match="empty_polls"):
        embedded.poll_interval(-1)


def test_message_published_while_backed_off_is_consumed(tmp_path: Path) -> None:
    url = _url(tmp_path)
    declare_queue(make_celery(url), "t")
    received: list = []
    with Connection(url) as conn:
        queue = experiment_queue("t")
        consumer = Consumer(conn.default_channel, queues=[queue], accept=["json"],
                            callbacks=[lambda body, message: (received.append(body), message.ack())])
        consumer.consume()
        transport = conn.transport
        assert isinstance(transport, embedded.Transport)
        deadline = time.monotonic() + 30
        while embedded.poll_interval(transport.empty_polls) < embedded.POLL_MAX:  # idle until fully backed off
            assert time.monotonic() < deadline
            with pytest.raises(TimeoutError):
                conn.drain_events(timeout=0.05)
        _publish(url, [1, 2])  # from another connection, while this consumer waits POLL_MAX between polls
        deadline = time.monotonic() + 30
        while len(received) < 2 and time.monotonic() < deadline:
            conn.drain_events(timeout=1)
        assert received == [1, 2]
        assert transport.empty_polls == 0  # fast again after a message
    with sqlite3.connect(tmp_path / "broker.sqlite") as db:
        assert db.execute("SELECT count(*) FROM kombu_message").fetchone()[0] == 0  # claimed rows are deleted


def _consumer_process(url: str, results, count, total: int, holders, n_consumers: int) -> None:
    prepare_embedded_broker(url)
    received: list = []

    def hold() -> None:
        """Keep the first message until every consumer holds one: the others must claim rows meanwhile."""
        with holders.get_lock():
            holders.value += 1
        deadline = time.monotonic() + 120
        while holders.value < n_consumers and time.monotonic() < deadline:
            time.sleep(0.01)

    _consume(url, 120.0, received, count=count, total=total, on_first=hold)
    results.put(received)


def test_each_message_claimed_by_exactly_one_consumer(tmp_path: Path) -> None:
    url = _url(tmp_path)
    declare_queue(make_celery(url), "t")
    ctx = multiprocessing.get_context("fork")
    results, count, holders = ctx.Queue(), ctx.Value("i", 0), ctx.Value("i", 0)
    procs = [ctx.Process(target=_consumer_process, args=(url, results, count, 120, holders, 3)) for _ in range(3)]
    for p in procs:
        p.start()
    _publish(url, list(range(120)))
    got = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(10)
    everything = sorted(b for part in got for b in part)
    assert everything == list(range(120))  # none lost, none twice
    assert holders.value == 3  # each consumer claimed rows while the others held theirs unacknowledged
    assert all(got)


def test_unacknowledged_message_given_back_on_close(tmp_path: Path) -> None:
    url = _url(tmp_path)
    declare_queue(make_celery(url), "t")
    _publish(url, [7])
    held: list = []
    _consume(url, 1.0, held, ack=False).release()  # kombu restores what its channel held unacknowledged
    assert held == [7]
    again: list = []
    _consume(url, 1.0, again).release()
    assert again == [7]


def test_broker_file_pragmas_and_index(tmp_path: Path) -> None:
    url = _url(tmp_path)
    declare_queue(make_celery(url), "t")
    with Connection(url) as conn:
        engine, _ = conn.default_channel._open()
        with engine.connect() as db:
            assert db.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert db.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    with sqlite3.connect(tmp_path / "broker.sqlite") as db:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert embedded.INDEX_NAME in names


def test_consumer_at_its_prefetch_count_waits_for_an_ack_not_the_database(tmp_path: Path) -> None:
    url = _url(tmp_path)
    declare_queue(make_celery(url), "t")
    _publish(url, [1, 2])
    held: list = []
    with Connection(url) as conn:
        channel = conn.default_channel
        channel.basic_qos(0, 1, False)  # prefetch 1, as a worker process
        consumer = Consumer(channel, queues=[experiment_queue("t")], accept=["json"],
                            callbacks=[lambda body, message: held.append(message)])
        consumer.consume()
        transport = conn.transport
        conn.drain_events(timeout=30)
        assert [m.payload for m in held] == [1]
        polls = transport.polls
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=3 * embedded.POLL_MAX)  # full: waits for an ack, no query
        assert transport.polls == polls
        held[0].ack()
        assert transport.room.is_set()
        conn.drain_events(timeout=30)
        assert [m.payload for m in held] == [1, 2]
        held[1].ack()
