"""Benchmark: what Celery's task events and remote control cost a labswarm worker (issue 28), on RabbitMQ.

    .venv/bin/python bench/celery_events.py [--tasks N] [--repeat R] [--task-ms MS] [--amqp URL]

Side by side in this process, alternating, ``--repeat`` rounds: ``N`` task messages are published to a fresh
durable queue, then a worker (a subprocess: ``make_celery``'s settings, prefork with one pool process, as
``labswarm worker``) drains it, once with events and remote control off (the baseline, labswarm's setting
before issue 28) and once with both on (Flower's and ``celery inspect``'s requirement). Its task does nothing
(``--task-ms 0``: the worst case, where the three event messages per task weigh most) or sleeps ``MS`` ms (a
feature task takes 10-1000 ms). Measured over the same span, from the first message taken to the queue's
emptying (the worker's start is not counted): tasks/s, and the worker's CPU time per task (its main process and
its pool process, user + system: what the events cost the worker, and far less sensitive than tasks/s to the
other load of a shared machine). Reported: the median of each, and the medians of the ratios of the rounds run
side by side (on/off of round r).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid

import psutil
from kombu import Connection, Exchange, Producer, Queue

TASK = "bench.noop"


def worker(broker: str, queue: str, mode: str, task_ms: float) -> None:
    """The worker subprocess: labswarm's Celery app with a task of ``task_ms`` ms, on ``queue``; ``mode``: off,
    on (both), events, remote."""
    from labswarm.queue.app import make_celery

    app = make_celery(broker, role="worker", experiment="bench", events=mode in ("on", "events"),
                      remote_control=mode in ("on", "remote"))
    on = app.conf.worker_send_task_events

    @app.task(name=TASK)
    def noop() -> None:
        if task_ms:
            time.sleep(task_ms / 1000)

    quiet = [] if on else ["--without-heartbeat"]
    app.worker_main(["worker", "-Q", queue, "-c", "1", "-P", "prefork", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
                     "--loglevel", "WARNING", "--without-gossip", "--without-mingle", *quiet])


def publish(conn: Connection, queue: Queue, n: int) -> None:
    """``n`` task messages (Celery's protocol 2, as ``send_task`` writes them), persistent, confirmed."""
    channel = conn.channel()
    queue(channel).declare()
    producer = Producer(channel, exchange=queue.exchange, routing_key=queue.routing_key)
    for _ in range(n):
        task_id = str(uuid.uuid4())
        producer.publish([[], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
                         serializer="json", delivery_mode=2,
                         headers={"lang": "py", "task": TASK, "id": task_id, "root_id": task_id,
                                  "parent_id": None, "group": None, "retries": 0, "argsrepr": "()",
                                  "kwargsrepr": "{}", "origin": "bench", "ignore_result": True})
    channel.close()


def depth(conn: Connection, name: str) -> int:
    channel = conn.channel()
    try:
        return channel.queue_declare(queue=name, passive=True).message_count
    finally:
        channel.close()


def cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children so far."""
    main = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in (main, *main.children(recursive=True)))


def round_(broker: str, n: int, mode: str, task_ms: float) -> tuple[float, float]:
    """``(tasks/s, worker CPU ms per task)`` of one worker draining ``n`` messages."""
    name = f"bench-events-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name, type="direct", durable=True), routing_key=name, durable=True)
    with Connection(broker) as conn:
        publish(conn, queue, n)
        process = subprocess.Popen([sys.executable, __file__, "--worker", mode, "--queue", name,
                                    "--amqp", broker, "--task-ms", str(task_ms)])
        try:
            while (left := depth(conn, name)) >= n:
                time.sleep(0.005)
            t0, first, cpu0 = time.perf_counter(), left, cpu(process.pid)
            while depth(conn, name) > 0:
                time.sleep(0.005)
            rate = first / (time.perf_counter() - t0)
            per_task = (cpu(process.pid) - cpu0) * 1000 / first
        finally:
            process.terminate()
            process.wait(60)
            channel = conn.channel()
            channel.queue_delete(name)
            channel.exchange_delete(name)
            channel.close()
    return rate, per_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--task-ms", type=float, default=0.0)
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--worker", choices=("on", "off", "events", "remote"))
    parser.add_argument("--modes", default="off,on", help="what to compare: off, on, events, remote")
    parser.add_argument("--queue")
    args = parser.parse_args()
    if args.worker:
        worker(args.amqp, args.queue, args.worker == "on", args.task_ms)
        return
    modes = args.modes.split(",")
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for r in range(args.repeat):
        for mode in modes:
            rate, per_task = round_(args.amqp, args.tasks, mode, args.task_ms)
            runs[mode].append((rate, per_task))
            print(f"round {r + 1}: {mode:6s} {rate:8.1f} tasks/s, worker CPU {per_task:6.3f} ms/task", flush=True)
    base = runs[modes[0]]
    print(f"{args.repeat} rounds of {args.tasks} tasks, task {args.task_ms:g} ms; medians:")
    for mode, rows in runs.items():
        rates = statistics.median(r / b for (r, _), (b, _) in zip(rows, base, strict=True))
        cpus = statistics.median(c / b for (_, c), (_, b) in zip(rows, base, strict=True))
        print(f"  {mode:6s} {statistics.median(r for r, _ in rows):8.1f} tasks/s ({rates:.3f}x), worker CPU "
              f"{statistics.median(c for _, c in rows):6.3f} ms/task ({cpus:.3f}x)")


if __name__ == "__main__":
    main()
