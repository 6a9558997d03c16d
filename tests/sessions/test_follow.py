"""Sessions that follow their catalog (issue 27, item 4): rows appended to the labels CSV are published as they
appear, never twice (across a manager restart too), removed rows are ignored, and the session ends only when
cancelled.

The tail reader on real files; a followed session of the session service on the embedded broker (no worker:
the ledger and the counters say what was published); and end to end, a manager over HTTP on the real RabbitMQ
with real ``labswarm worker`` processes, stopped and started again while rows are appended; and
``labswarm run --follow``, ended by Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import delete_queue, experiment_dict, missing, wait_until, write_dataset, write_tone
from sqlalchemy import func, select

from labswarm.client import ManagerClient
from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer, free_port
from labswarm.paths import DataRoots
from labswarm.queue.app import queue_name
from labswarm.sample import ExperimentSamples, iter_samples
from labswarm.sessions.follow import LabelsTail
from labswarm.sessions.models import SampleRow
from labswarm.sessions.service import SessionService
from labswarm.settings import Settings
from labswarm.store import FeatureStore

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"


def rabbitmq() -> None:
    """The local RabbitMQ reachable, or :func:`missing`."""
    from kombu import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        missing(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({type(exc).__name__}: {exc})")


def append(data: Path, *names: str, label: str = "low") -> None:
    """Write a tone per name under ``data`` and append its row to the labels CSV (after the audio exists)."""
    for name in names:
        write_tone(data / name, seconds=2.0)
    with (data / "labels.csv").open("a") as handle:
        handle.writelines(f"{name},{label},{name}\n" for name in names)


def read_all(tail: LabelsTail) -> list[str]:
    return [clip.clip_id for chunk in tail.rows() for clip in chunk] if tail.changed() else []


def test_the_tail_reads_appended_whole_lines_once_and_rereads_a_replaced_file(tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    data = write_dataset(tmp_path / "data")
    labels = data / "labels.csv"
    tail = LabelsTail(data, labels, DataRoots([data]))
    assert read_all(tail) == ["low/low_0.wav", "low/low_1.wav", "high/high_0.wav", "high/high_1.wav"]
    assert read_all(tail) == []  # unchanged: one stat, nothing read
    with labels.open("a") as handle:
        handle.write('new/a.wav,low,s\n"new/b,c.wav",high\nnew/partial.wav,lo')  # the last line is being written
    assert read_all(tail) == ["new/a.wav", "new/b,c.wav"]
    with labels.open("a") as handle:
        handle.write("w\n,low\n/etc/passwd,low\n")
    with labels.open("ab") as binary:
        binary.write(b"\xff.wav,low\n\nnew/c.wav,high\n")
    with caplog.at_level(logging.WARNING, logger="labswarm.sessions.follow"):
        assert read_all(tail) == ["new/partial.wav", "new/c.wav"]
    warned = caplog.text
    assert "line 9: empty path or label" in warned and "line 10 (column path): outside the allowed data roots" in warned
    assert "line 11: not a UTF-8 CSV row" in warned
    assert "/etc/passwd" not in warned  # a row's content is never quoted
    # a row removed: the file is shorter (or replaced): read again from its start, the caller skips what it has
    lines = labels.read_bytes().splitlines(keepends=True)
    replaced = tmp_path / "new.csv"
    replaced.write_bytes(b"".join(lines[:2] + lines[3:6]))
    replaced.replace(labels)
    assert read_all(tail) == ["low/low_0.wav", "high/high_0.wav", "high/high_1.wav", "new/a.wav"]


def test_a_worker_finds_a_row_appended_a_moment_after_it_read_the_labels(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    config = parse_experiment(experiment_dict(data, tmp_path / "store"))
    samples = ExperimentSamples(config, reread_after=3600.0)  # the time rule alone would not read it again
    first = next(iter(iter_samples(config)))
    assert samples.verified(first.to_dict()) == first
    append(data, "late.wav")
    late = next(s for s in iter_samples(config) if s.id.startswith("late.wav#"))
    assert samples.verified(late.to_dict()) == late


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[[], SessionService]]:
    """A factory of session services on one home (the embedded broker, the SQLite ledger): a second one is the
    manager started again."""
    made: list[SessionService] = []

    def make() -> SessionService:
        svc = SessionService(Settings(home=tmp_path / "home", data_roots=[tmp_path], reconcile_after=600.0))
        svc.start()
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop()
        svc.engine.dispose()


def ledger_ids(svc: SessionService, session_id: str) -> dict[str, int]:
    with svc.db() as db:
        return dict(db.execute(select(SampleRow.sample_id, SampleRow.attempts)
                               .where(SampleRow.session_id == session_id)).all())


def test_a_followed_session_publishes_appended_rows_once_across_a_restart(service, tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")  # 4 clips x 2 transformations
    svc = service()
    svc.registry.register(experiment_dict(data, tmp_path / "store", name="followed"))
    session_id = svc.start_session("followed", rate=500.0, follow=True).id
    assert svc.progress(session_id)["follow"] is True

    def published(n: int) -> Callable[[], dict | None]:
        return lambda: (p := svc.progress(session_id))["published"] == p["total"] == n and p

    progress = wait_until(published(8), "the 8 samples of the file")
    assert progress["status"] == "running" and progress["phase"] == "follow"
    append(data, "more/a.wav", "more/b.wav")
    wait_until(published(12), "the appended rows' 4 samples")
    svc.stop()  # the manager goes down; rows are appended meanwhile
    append(data, "more/c.wav")
    svc = service()
    progress = wait_until(published(14), "the row appended while the manager was down")
    assert progress["status"] == "running" and progress["pending"] == 14
    ids = ledger_ids(svc, session_id)
    assert len(ids) == 14 and set(ids.values()) == {1}  # each sample published once
    # a removed row is ignored: nothing withdrawn, nothing published again; a row appended after it still is
    lines = (data / "labels.csv").read_text().splitlines(keepends=True)
    (data / "labels.csv").write_text("".join(lines[:1] + lines[2:]))
    append(data, "more/d.wav")
    wait_until(published(16), "the row appended after one was removed")
    assert len(ledger_ids(svc, session_id)) == 16
    ended = svc.cancel(session_id)
    assert ended.status == "cancelled"
    # the runner was joined by cancel: nothing publishes any more
    append(data, "more/e.wav")
    with svc.db() as db:
        assert db.scalar(select(func.count()).select_from(SampleRow).where(SampleRow.session_id == session_id)) == 16


@pytest.mark.slow
def test_a_followed_session_over_rabbitmq_with_workers_computes_each_appended_sample_once(tmp_path: Path) -> None:
    rabbitmq()
    data = write_dataset(tmp_path / "data")
    name = f"follow-{uuid.uuid4().hex[:8]}"
    config = experiment_dict(data, tmp_path / "store", name=name)
    settings = Settings(home=tmp_path / "home", broker_url=RABBITMQ_URL, data_roots=[tmp_path], reconcile_after=600.0)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = EmbeddedServer(create_app(settings), port=port).start()
    client = ManagerClient(url, timeout=30.0)
    launcher = LocalLauncher(name, url, broker_url=RABBITMQ_URL, log_dir=tmp_path / "logs", restart=None)
    try:
        client.post_experiment(config)
        launcher.start(1)
        session_id = client.start_session(name, 50.0, follow=True)["id"]

        def done(n: int) -> Callable[[], dict | None]:
            return lambda: (p := client.session(session_id))["done"] == p["total"] == n and p

        wait_until(done(8), "the file's 8 samples computed", 120)
        append(data, "more/a.wav", "more/b.wav")
        wait_until(done(12), "the appended rows computed", 60)
        server.stop()
        append(data, "more/c.wav")
        server = EmbeddedServer(create_app(settings), port=port).start()
        progress = wait_until(done(14), "the row appended while the manager was down, computed", 60)
        assert progress["status"] == "running" and progress["follow"] is True
        assert progress["published"] == 14 and progress["republished"] == 0 and progress["failed"] == 0
        assert FeatureStore(tmp_path / "store").stats().entries == 14 * 2  # two features per sample, once
        client.cancel(session_id)
        final = wait_until(lambda: (p := client.session(session_id))["status"] == "cancelled" and p, "the cancel")
        assert final["phase"] is None and final["finished_at"] is not None
    finally:
        launcher.stop(timeout=15.0)
        server.stop()
        client.close()
        delete_queue(RABBITMQ_URL, queue_name(name))


@pytest.mark.slow  # the console script: an embedded manager, a worker process, Ctrl-C (~40 s at load 8)
def test_labswarm_run_follow_computes_appended_rows_until_ctrl_c_cancels_it(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")  # 8 samples, 2 features each
    experiment = tmp_path / "followed.yml"
    experiment.write_text(yaml.safe_dump(experiment_dict(data, tmp_path / "store", name="followed")))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABSWARM_")}
    env.update(COLUMNS="160", LABSWARM_HOME=str(home))
    # Ctrl-C's SIGINT at its default in the child: a test run started in the background (`pytest ... &` in a
    # script, as CI may be) ignores SIGINT, an ignored signal stays ignored across exec, and a Python process that
    # starts with it ignored never raises KeyboardInterrupt (the run then never ended: 120 s, killed)
    run = subprocess.Popen([sys.executable, "-m", "labswarm.cli", "run", str(experiment), "--workers", "1",
                            "--no-health", "--follow"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    store = FeatureStore(tmp_path / "store")
    try:
        wait_until(lambda: store.stats().entries == 16 or run.poll() is not None, "the file's samples computed", 180)
        assert run.poll() is None, run.communicate()[0]
        append(data, "more/a.wav")
        wait_until(lambda: store.stats().entries == 20 or run.poll() is not None, "the appended row computed", 60)
        assert run.poll() is None, run.communicate()[0]
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 130, out
    server = EmbeddedServer(create_app(Settings(home=home, data_roots=[str(tmp_path)]))).start()
    try:
        with httpx.Client(base_url=server.url) as http:
            (session,) = http.get("/sessions").json()
    finally:
        server.stop()
    assert session["status"] == "cancelled" and session["follow"] is True, session
    assert session["total"] == session["published"] == session["done"] == 10 and session["republished"] == 0
