"""A session on a manager whose workers already run, warm: the distributed run measured like the local pool.

`bench/distributed.py` times the local pool from `run_local`'s call in a process that imported and warmed up the
audio libraries before (its plain loop): the pool's processes fork from that warm process, so the pool's wall time
holds no interpreter start, no import and no warm-up. `labswarm run`'s wall time holds all three for each worker
(~3 s of CPU each on the benchmark machine, docs/benchmarks/distributed.md), plus the manager's start and the
workers' stop. This measures the distributed path like the pool: the manager (embedded in this process), its
health controller and the workers (`labswarm worker` processes, over RabbitMQ) are started and warm before the
timed part, as a deployed swarm's are; the time runs from the session's start (`POST
/experiments/{name}/sessions`) to its end as the manager's publisher ends it (told at once: its ``on_end``
listener); the workers go on running after it (they are stopped outside the timed part).

Used by `bench/distributed.py` (the row "session on warm workers"); alone:

    .venv/bin/python bench/warm_session.py [--clips 30]
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

#: Seconds the workers get to start and consume before the timed part fails.
READY_S = 300.0


def consumers(url: str, queue: str) -> int:
    """Consumers of ``queue`` on the RabbitMQ at ``url`` (0 while the queue is not declared)."""
    from kombu import Connection

    try:
        with Connection(url) as conn:
            return int(conn.default_channel.queue_declare(queue, passive=True).consumer_count)
    except Exception:  # the queue is not declared yet (404 closes the channel)
        return 0


def warm_session(config, broker: str, home: Path, workers: int = 2, rate: float = 5000.0):
    """Run ``config`` as a session of a running manager with ``workers`` warm workers over RabbitMQ ``broker``.

    Returns:
        ``(wall s from the session's start to its end, steady samples/s, progress)``.

    Raises:
        SystemExit: the workers did not start, or the session did not complete cleanly.
    """
    from distributed import steady_rate

    from labswarm.client import ManagerClient
    from labswarm.config.roots import experiment_folders
    from labswarm.deploy.local import LocalLauncher
    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer
    from labswarm.queue.app import queue_name
    from labswarm.run import HealthThread
    from labswarm.settings import Settings

    settings = Settings(home=home, broker_url=broker, default_rate=rate,
                        data_roots=[Path.cwd(), *experiment_folders(config)])  # as labswarm run's manager
    app = create_app(settings)
    ended = threading.Event()
    app.state.sessions.context.on_end.append(lambda _session_id: ended.set())
    server = EmbeddedServer(app).start()
    client = ManagerClient(server.url, None)
    launcher = LocalLauncher(config.name, server.url, broker_url=broker, log_dir=home / "logs")
    health = None
    try:
        client.post_experiment(config.model_dump(mode="json"))
        launcher.start(workers)
        deadline = time.monotonic() + READY_S
        while consumers(broker, queue_name(config.name)) < workers:
            if time.monotonic() > deadline:
                raise SystemExit(f"{workers} warm workers did not consume within {READY_S:.0f} s")
            time.sleep(0.2)
        health = HealthThread(server.url, None, None, workers, home / "health").start()
        t0 = time.perf_counter()
        session = client.start_session(config.name)
        while not ended.wait(0.5):  # the listener tells at once; the poll only guards a session ended otherwise
            if client.session(session["id"])["status"] in ("completed", "failed", "cancelled"):
                break
        wall = time.perf_counter() - t0
        progress = client.session(session["id"])
        if progress["status"] != "completed" or progress["failed"]:
            raise SystemExit(f"warm session did not complete cleanly: {progress}")
        return wall, steady_rate(home, session["id"])[0], progress
    finally:
        if health is not None:
            health.stop()
        launcher.stop()
        client.close()
        server.stop()


def main() -> None:
    import argparse
    import tempfile
    import uuid

    from features_local import demo_experiment

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("demo", nargs="?", default=str(Path(__file__).resolve().parents[1] / "data" / "demo"))
    parser.add_argument("--clips", type=int, default=30)
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="labswarm-bench-warm-"))
    slug = uuid.uuid4().hex[:6]
    config = demo_experiment(Path(args.demo), args.clips, tmp)(slug).model_copy(update={"name": f"warm-{slug}"})
    wall, rate, progress = warm_session(config, args.amqp, tmp / "home")
    print(f"session on warm workers: {wall:.1f} s, {rate:.2f} samples/s steady, {progress['done']} done")


if __name__ == "__main__":
    main()
