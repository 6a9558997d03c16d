"""The broker client's publishing contract, against a real RabbitMQ and the embedded SQLite broker: batches
confirmed whole, Celery's task message format, back-pressure at the queue bound, several publishing threads,
a broker that cannot be reached, and permanent refusals (PublishError)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import delete_queue
from kombu import Connection, Exchange, Queue

from labswarm.errors import PublishError
from labswarm.queue.app import TASK_NAME, queue_name
from labswarm.sample import Sample
from labswarm.sessions.broker import BrokerClient
from labswarm.settings import Settings

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
RABBITMQCTL = "/usr/sbin/rabbitmqctl"


def _missing(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def rabbitmq_url() -> str:
    try:
        with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        _missing(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({exc}); run `bash .ci/rabbitmq`")
    return RABBITMQ_URL


@pytest.fixture
def experiment(rabbitmq_url: str) -> Iterator[str]:
    """A unique experiment name whose queue is deleted after the test."""
    name = f"b-{uuid.uuid4().hex[:10]}"
    yield name
    delete_queue(rabbitmq_url, queue_name(name))


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator:
    """``make_client(broker_url, **settings)``: a BrokerClient, its connections closed after the test."""
    clients: list[BrokerClient] = []

    def make(broker_url: str, **settings) -> BrokerClient:
        clients.append(BrokerClient(Settings(home=tmp_path, broker_url=broker_url, **settings)))
        return clients[-1]

    yield make
    for client in clients:
        client.close()

def samples(n: int, prefix: str = "c") -> list[Sample]:
    return [Sample(id=f"{prefix}{i}#0", path=f"/data/{prefix}{i}.wav", label="a", source=f"s{i}", start=0.0,
                   duration=1.0, transformation={"name": "identity"}, seed=i) for i in range(n)]


def drain(url: str, experiment: str) -> list:
    """Every message waiting in the experiment's queue (taken and acknowledged), in order."""
    out = []
    with Connection(url) as conn:
        channel = conn.default_channel
        while (raw := channel.basic_get(queue_name(experiment), no_ack=True)) is not None:
            out.append(channel.message_to_python(raw))
    return out


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:  # a wait: free when met, long for a loaded CI
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_batch_confirmed_in_celery_format(make_client, rabbitmq_url: str, experiment: str) -> None:
    client = make_client(rabbitmq_url)
    client.declare_queue(experiment)
    batch = samples(250)
    assert client.publish_many("sess1", experiment, batch, threading.Event(), fingerprint="f00d") == 250
    assert client.queue_depth(experiment) == 250
    messages = drain(rabbitmq_url, experiment)
    assert len(messages) == 250
    first = messages[0]
    assert first.headers["task"] == TASK_NAME and first.headers["id"] == first.properties["correlation_id"]
    assert first.properties["delivery_mode"] == 2  # persistent
    args, kwargs, _embed = first.decode()
    assert args == ["sess1", batch[0].to_dict()] and kwargs == {"fingerprint": "f00d"}
    assert [m.decode()[0][1]["id"] for m in messages] == [s.id for s in batch]


def test_queue_full_backs_off_and_loses_nothing(make_client, rabbitmq_url: str, experiment: str) -> None:
    client = make_client(rabbitmq_url, max_queue_length=20)
    client.declare_queue(experiment)
    stop = threading.Event()
    result: list[int] = []
    publisher = threading.Thread(target=lambda: result.append(client.publish_many("s", experiment, samples(60),
                                                                                    stop)))
    publisher.start()
    wait_for(lambda: client.queue_depth(experiment) == 20, "the queue to reach its bound")
    assert publisher.is_alive()  # refused messages are published again, not dropped
    got = []
    while publisher.is_alive() or client.queue_depth(experiment):
        got += drain(rabbitmq_url, experiment)
    publisher.join()
    assert result == [60]
    assert sorted(m.decode()[0][1]["id"] for m in got) == sorted(s.id for s in samples(60))


def test_stop_returns_the_confirmed_prefix(make_client, rabbitmq_url: str, experiment: str) -> None:
    client, watcher = make_client(rabbitmq_url, max_queue_length=7), make_client(rabbitmq_url)
    client.declare_queue(experiment)
    stop = threading.Event()

    def stop_once_full() -> None:  # not a 1-s timer: under load the publish may not have begun by then (0 taken)
        deadline = time.monotonic() + 120
        while (watcher.queue_depth(experiment) or 0) < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=stop_once_full, daemon=True).start()
    assert client.publish_many("s", experiment, samples(30), stop) == 7  # the queue took 7, nobody consumed


def test_threads_publish_at_once_on_their_own_connections(make_client, rabbitmq_url: str,
                                                          experiment: str) -> None:
    client = make_client(rabbitmq_url)
    client.declare_queue(experiment)
    counts: list[int] = []

    def publish(prefix: str) -> None:
        for start in range(0, 400, 200):
            counts.append(client.publish_many("s", experiment, samples(400, prefix)[start:start + 200],
                                              threading.Event()))

    threads = [threading.Thread(target=publish, args=(p,)) for p in "xyz"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == [200] * 6
    assert client.queue_depth(experiment) == 1200
    assert len(client._publishers) == 3


def test_unreachable_broker_retries_until_stopped(make_client) -> None:
    client = make_client("amqp://guest:guest@127.0.0.1:1//")
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    assert client.publish_many("s", "nowhere", samples(3), stop) == 0  # no error: the broker may come back
    assert time.monotonic() - t0 >= 0.9


def test_queue_declared_with_other_arguments_is_permanent(make_client, rabbitmq_url: str,
                                                          experiment: str) -> None:
    with Connection(rabbitmq_url) as conn:  # someone declared the queue with another bound
        Queue(queue_name(experiment), Exchange("labswarm", type="direct", durable=True),
              routing_key=queue_name(experiment), durable=True,
              queue_arguments={"x-max-length": 3, "x-overflow": "reject-publish"})(conn.default_channel).declare()
    client = make_client(rabbitmq_url, max_queue_length=50)
    with pytest.raises(PublishError) as info:
        client.publish_many("s", experiment, samples(5), threading.Event())
    message = str(info.value)
    assert queue_name(experiment) in message and "PRECONDITION_FAILED" in message, message
    assert "guest:guest" not in message


@pytest.fixture
def no_write_user(rabbitmq_url: str) -> Iterator[tuple[str, str]]:
    """A RabbitMQ user that may declare queues but not publish to the labswarm exchange: (user, password)."""
    if not os.access(RABBITMQCTL, os.X_OK):
        _missing(f"{RABBITMQCTL} is missing: this test creates a user")
    user, password = f"ro-{uuid.uuid4().hex[:6]}", f"pw-{uuid.uuid4().hex}"

    def ctl(*args: str) -> None:
        subprocess.run([RABBITMQCTL, *args], check=True, capture_output=True, timeout=60)

    ctl("add_user", user, password)
    try:
        # configure anything, read anything, write only the queues (queue.bind needs write on the queue),
        # not the labswarm exchange: basic.publish is refused
        ctl("set_permissions", "-p", "/", user, ".*", "^labswarm\\..*", ".*")
        yield user, password
    finally:
        ctl("delete_user", user)


def test_access_refused_is_permanent_and_hides_the_password(make_client, no_write_user: tuple[str, str],
                                                            experiment: str) -> None:
    user, password = no_write_user
    client = make_client(f"amqp://{user}:{password}@127.0.0.1:5672//")
    client.declare_queue(experiment)  # allowed
    stop = threading.Event()
    timer = threading.Timer(120, stop.set)  # retried as a transient error, it would return 0 once stopped
    timer.start()
    try:
        with pytest.raises(PublishError) as info:
            client.publish_many("s", experiment, samples(5), stop)
    finally:
        timer.cancel()
    assert not stop.is_set()  # raised, not stopped
    message = str(info.value)
    assert queue_name(experiment) in message and "ACCESS_REFUSED" in message, message
    assert password not in message


def test_embedded_batch_in_one_transaction(make_client, tmp_path: Path) -> None:
    url = f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}"
    client = make_client(url)
    client.declare_queue("emb")
    assert client.publish_many("s", "emb", samples(300), threading.Event(), fingerprint="ab") == 300
    assert client.queue_depth("emb") == 300
    with Connection(url) as conn:
        queue = conn.SimpleQueue(queue_name("emb"), no_ack=True)
        message = queue.get(timeout=30)  # there already: free when met
        assert message.headers["task"] == TASK_NAME
        assert message.decode()[0] == ["s", samples(1)[0].to_dict()]
        assert message.delivery_info["routing_key"] == queue_name("emb")
        queue.close()


def test_a_permanent_refusal_fails_the_session_with_the_reason(tmp_path: Path, no_write_user: tuple[str, str]) -> None:
    from helpers import experiment_dict, write_dataset

    from labswarm.sessions.service import SessionService

    user, password = no_write_user
    name = f"p-{uuid.uuid4().hex[:8]}"
    service = SessionService(Settings(home=tmp_path / "home", broker_url=f"amqp://{user}:{password}@127.0.0.1:5672//"))
    try:
        service.registry.register(experiment_dict(write_dataset(tmp_path / "data"), tmp_path / "store", name=name))
        sid = service.start_session(name, rate=100.0).id  # the queue is declared: that much is allowed
        wait_for(lambda: service.session(sid).status != "running", "the session to end", timeout=120.0)
        row = service.session(sid)
        assert row.status == "failed"
        assert row.error.startswith("PublishError: ") and "ACCESS_REFUSED" in row.error, row.error
        assert queue_name(name) in row.error and password not in row.error
        assert row.published == 0
    finally:
        service.stop()
        service.broker.close()
        delete_queue(RABBITMQ_URL, queue_name(name))


def test_a_broker_refusing_the_managers_login_is_a_502_naming_it_not_a_500(tmp_path: Path) -> None:
    """Starting a session on a manager whose broker URL has a wrong password: 502 with the broker's reason
    (password masked), nothing left behind (no session row); it was a 500 (amqp's AccessRefused untranslated)."""
    import httpx
    from helpers import experiment_dict, write_dataset

    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer

    wrong = "not-the-guest-password-" + uuid.uuid4().hex[:6]
    settings = Settings(home=tmp_path / "home", broker_url=f"amqp://guest:{wrong}@127.0.0.1:5672//",
                        data_roots=[str(tmp_path)])
    name = f"r-{uuid.uuid4().hex[:8]}"
    with EmbeddedServer(create_app(settings)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        experiment = experiment_dict(write_dataset(tmp_path / "data"), tmp_path / "store", name=name)
        assert http.post("/experiments", json=experiment).status_code == 201
        answer = http.post(f"/experiments/{name}/sessions", json={})
        assert answer.status_code == 502, answer.text
        detail = answer.json()["detail"]
        assert "ACCESS_REFUSED" in detail and queue_name(name) in detail and "guest:***@" in detail
        assert wrong not in answer.text
        assert http.get("/sessions").json() == []
