"""Celery's own tools see labswarm's workers (issue 28): a real ``labswarm worker`` on the real RabbitMQ runs a
session while Flower listens; ``celery inspect ping`` and ``inspect stats`` answer for the worker, count its
tasks and name labswarm's pool, and Flower's API lists the worker and the session's tasks, succeeded, once task
events are switched on at run time (``celery control enable_events``, what Flower itself sends every 5 s). Remote
control and worker heartbeats are on by default with RabbitMQ, task events off until a monitor asks
(:mod:`labswarm.queue.tooling`); all off with the embedded broker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import missing, wait_until

from labswarm.deploy.local import LocalLauncher
from labswarm.errors import ConfigError
from labswarm.manager.server import free_port
from labswarm.queue.app import TASK_NAME, make_celery
from labswarm.queue.tooling import heartbeats, tooling
from labswarm.queue.worker import POOL

CELERY = str(Path(sys.executable).parent / "celery")


def _celery(broker: str, *command: str, verb: str = "inspect") -> dict[str, Any]:
    """``celery --broker URL inspect COMMAND --json``'s answer (``verb="control"``: ``celery control``'s):
    ``{worker: reply}`` (``{}``: no node replied)."""
    done = subprocess.run([CELERY, "--broker", broker, verb, *command, "--json", "--timeout", "5"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return {}
    replies = json.loads(done.stdout.strip().splitlines()[-1])
    # inspect answers one mapping, control a list of one mapping per node
    return replies if isinstance(replies, dict) else {k: v for reply in replies for k, v in reply.items()}


@pytest.fixture
def flower(rabbitmq_url: str, tmp_path: Path) -> Iterator[str]:
    """Flower on a free port, listening to the broker's events (its API open: FLOWER_UNAUTHENTICATED_API)."""
    try:
        import flower as _  # noqa: F401
    except ImportError:
        missing("flower is not installed (the dev extra)")
    port = free_port()
    log = tmp_path / "flower.log"
    with open(log, "ab") as out:
        process = subprocess.Popen([CELERY, "--broker", rabbitmq_url, "flower", "--address=127.0.0.1",
                                    f"--port={port}"], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "FLOWER_UNAUTHENTICATED_API": "true"})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return httpx.get(f"{url}/healthcheck", timeout=2).text == "OK"
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, "Flower", 60, interval=0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.slow  # a worker and a session: ~50 s on the loaded 2-core machine
def test_celery_inspect_and_flower_see_the_worker_and_its_tasks(rabbitmq_url: str, flower: str,
                                                                make_cluster) -> None:
    cluster = make_cluster(broker_url=rabbitmq_url, tones=4)
    # one sample a message, as the stats below count: the publisher packs ~0.25 s of work a message (d909c5f), so
    # on a quiet machine two of these short samples shared one (11 messages for 12 samples)
    cluster.settings = cluster.settings.model_copy(update={"samples_per_message": 1})
    cluster.start_manager()
    cluster.client.post_experiment(cluster.config.model_dump(mode="json"))
    cluster.launcher = LocalLauncher(cluster.name, cluster.url, broker_url=rabbitmq_url,
                                     log_dir=cluster.tmp_path / "logs", restart=None)
    cluster.launcher.start(1)
    worker = cluster.launcher.processes[0].pid
    name = wait_until(lambda: next((n for n in _celery(rabbitmq_url, "ping") if f"-{worker}-" in n), None),
                      "the worker's answer to celery inspect ping", 120, interval=0.2)
    # task events are off by default (nothing in labswarm reads them) and switched on at run time through remote
    # control, as Flower itself does every 5 s (so its first tick may come first: "already enabled")
    # control enable_events (safe to repeat) and inspect stats wait 5 s for the reply: under load it may come later,
    # so each is asked again until the worker's reply comes (as the ping above); the reply itself is checked once
    reply = wait_until(lambda: _celery(rabbitmq_url, "enable_events", "-d", name, verb="control").get(name),
                       "the worker's answer to celery control enable_events", 120, interval=0.2)
    assert reply.get("ok") in ("task events enabled", "task events already enabled"), reply
    cluster.session_id = cluster.client.start_session(cluster.name, 50.0)["id"]
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)
    # the node name: labswarm-<experiment>-<pid>-<6 hex>@<host> (the random part: containers on the host network
    # share the host's name and often a pid, and a node's pidbox queue is exclusive)
    assert re.fullmatch(rf"labswarm-{re.escape(cluster.name)}-{worker}-[0-9a-f]{{6}}@.+", name), name
    stats = wait_until(lambda: _celery(rabbitmq_url, "stats", "-d", name).get(name),
                       "the worker's answer to celery inspect stats", 120, interval=0.2)
    assert stats["total"][TASK_NAME] == progress["total"], stats["total"]  # one sample a message
    # the pool is labswarm's (its warm stop 0.5 s shorter): set through conf.worker_pool, which Celery takes only
    # where the command line's -P is exactly 'prefork' (celery/bin/worker.py's WorkersPool); BasePool.info reports
    # "module:Class"
    assert stats["pool"]["implementation"] == POOL, stats["pool"]

    workers = wait_until(lambda: httpx.get(f"{flower}/api/workers", params={"refresh": "true"}, timeout=30).json(),
                         "Flower's workers", 60, interval=0.2)
    assert name in workers, list(workers)

    def succeeded() -> list[dict[str, Any]]:
        tasks = httpx.get(f"{flower}/api/tasks", params={"workername": name}, timeout=30).json().values()
        done = [t for t in tasks if t["name"] == TASK_NAME and t["state"] == "SUCCESS"]
        return done if len(done) == progress["total"] else []

    tasks = wait_until(succeeded, "Flower's record of the session's tasks", 60, interval=0.2)
    assert {t["worker"] for t in tasks} == {name}


def test_the_defaults_follow_the_broker(rabbitmq_url: str, tmp_path: Path) -> None:
    """Remote control and heartbeats on with RabbitMQ, task events off until a monitor asks; all off with the
    embedded broker; settable; remote control refused on the embedded one."""
    on = tooling(rabbitmq_url)
    assert on["worker_enable_remote_control"] and not on["worker_send_task_events"] and not on["task_send_sent_event"]
    assert heartbeats(make_celery(rabbitmq_url, role="worker").conf)  # what enable_events needs in a worker
    assert tooling(rabbitmq_url, events=True)["worker_send_task_events"]
    assert not heartbeats(make_celery(rabbitmq_url, role="worker", events=False, remote_control=False).conf)
    embedded = f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}"
    assert not any(tooling(embedded).values())
    assert not tooling(rabbitmq_url, events=False, remote_control=False)["worker_enable_remote_control"]
    with pytest.raises(ConfigError, match="LABSWARM_CELERY_REMOTE_CONTROL"):
        tooling(embedded, remote_control=True)
    app = make_celery(rabbitmq_url, role="worker", events=False)
    assert not app.conf.worker_send_task_events and app.conf.worker_enable_remote_control
    # a worker's events are not confirmed one by one (a round trip each); the manager's publishes are
    assert app.conf.broker_transport_options["confirm_publish"] is False
    assert make_celery(rabbitmq_url).conf.broker_transport_options["confirm_publish"] is True
