"""Benchmark: the publish rate of one manager to RabbitMQ, with publisher confirms and persistent messages.

    .venv/bin/python bench/publish.py [--samples N] [--batch B] [--amqp URL] [--repeat R]

In this one process, side by side (alternating, ``--repeat`` times; the best of each kept):

- baseline: Celery's own ``send_task`` loop with ``confirm_publish`` (one confirm round trip per message), the
  way the publisher worked before;
- ``BrokerClient.publish_many`` in batches of ``B`` (the session runner's), one session;
- the same with 3 sessions publishing at once (3 threads, 3 queues, one BrokerClient as in the manager).

Each run publishes the same samples to fresh durable queues (deleted afterwards). Goal (issue 10): >= 2,000
samples/s from one manager, several sessions at once.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path
from tempfile import mkdtemp

from kombu import Connection

from labswarm.queue.app import TASK_NAME, app_queue, queue_name
from labswarm.sample import Sample
from labswarm.sessions.broker import BrokerClient
from labswarm.settings import Settings


def make_samples(n: int, prefix: str) -> list[Sample]:
    """Samples like the demo set's (paths, a transformation with parameters), nothing read."""
    return [Sample(id=f"{prefix}/clip_{i:06d}.wav#{i % 9}", path=f"/data/{prefix}/clip_{i:06d}.wav", label="music",
                   source=f"src{i // 9}", start=0.0, duration=3.0,
                   transformation={"name": "pitch_shift", "semitones": 2.0}, seed=i * 7919) for i in range(n)]


def celery_loop(client: BrokerClient, experiment: str, samples: list[Sample]) -> float:
    """Samples/s of a ``send_task`` loop (Celery's publisher, ``confirm_publish``)."""
    queue = app_queue(client.celery, experiment)
    t0 = time.perf_counter()
    for s in samples:
        client.celery.send_task(TASK_NAME, args=("bench", s.to_dict()), queue=queue, exchange=queue.exchange,
                                routing_key=queue.routing_key)
    return len(samples) / (time.perf_counter() - t0)


def batched(client: BrokerClient, experiments: list[str], samples: list[Sample], batch: int) -> float:
    """Samples/s of ``publish_many`` in batches, one thread per experiment (session), all at once."""
    stop = threading.Event()
    confirmed: list[int] = []

    def run(experiment: str) -> None:
        n = 0
        for i in range(0, len(samples), batch):
            n += client.publish_many(f"bench-{experiment}", experiment, samples[i:i + batch], stop,
                                     fingerprint="0123456789abcdef")
        confirmed.append(n)

    threads = [threading.Thread(target=run, args=(e,)) for e in experiments]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert confirmed == [len(samples)] * len(experiments), confirmed
    return sum(confirmed) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4000, help="samples per session and run")
    parser.add_argument("--batch", type=int, default=200, help="samples per publish_many call")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    client = BrokerClient(Settings(home=Path(mkdtemp(prefix="labswarm-bench-publish-")), broker_url=args.amqp))
    tag = uuid.uuid4().hex[:6]
    names = {k: [f"bench-pub-{tag}-{k}-{i}" for i in range(n)] for k, n in (("celery", 1), ("one", 1), ("three", 3))}
    samples = make_samples(args.samples, "demo")
    best = {"celery": 0.0, "one": 0.0, "three": 0.0}
    try:
        for names_ in names.values():
            for name in names_:
                client.declare_queue(name)
        for r in range(args.repeat):
            best["celery"] = max(best["celery"], celery_loop(client, names["celery"][0], samples[: args.samples // 4]))
            best["one"] = max(best["one"], batched(client, names["one"], samples, args.batch))
            best["three"] = max(best["three"], batched(client, names["three"], samples, args.batch))
            print(f"run {r + 1}: celery {best['celery']:.0f}, one session {best['one']:.0f}, three sessions "
                  f"{best['three']:.0f} samples/s (best so far)", flush=True)
            for names_ in names.values():
                for name in names_:
                    client.purge_queue(name)
    finally:
        client.close()
        with Connection(args.amqp) as conn:
            for names_ in names.values():
                for name in names_:
                    conn.default_channel.queue_delete(queue_name(name))
    base = best["celery"]
    print(f"\n| publisher (confirms, persistent; batches of {args.batch}) | samples/s | vs Celery send_task |")
    print("|---|---:|---:|")
    print(f"| Celery send_task loop (confirm per message) | {base:.0f} | 1.00x |")
    print(f"| publish_many, 1 session | {best['one']:.0f} | {best['one'] / base:.2f}x |")
    print(f"| publish_many, 3 sessions at once (total) | {best['three']:.0f} | {best['three'] / base:.2f}x |")


if __name__ == "__main__":
    main()
