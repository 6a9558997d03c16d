"""The figures of ``bench/tenants.py`` (issue 26's load test): every job's state, queue waits, the contended
window's slot-seconds and Jain's index (:func:`analyse`), printed (:func:`report`) or as a JSON object
(:func:`figures`)."""

from __future__ import annotations

import statistics
import time
from datetime import datetime

import httpx
import numpy as np

#: Seconds between two instants of the contended window's sampling.
STEP = 0.1


def jain(shares: list[float]) -> float:
    """Jain's fairness index (Jain, Chiu, Hawe 1984): (sum x)^2 / (n sum x^2), 1 when all are equal."""
    total = sum(shares)
    return total * total / (len(shares) * sum(x * x for x in shares)) if total else float("nan")


def stamp(text: str | None) -> float:
    return datetime.fromisoformat(text).timestamp() if text else float("nan")


def analyse(http: httpx.Client, users: list[str]) -> dict:
    """Every job's state, each user's queue waits and slot-seconds in the contended window, Jain's index."""
    jobs, offset = [], 0
    while True:
        page = http.get("/v1/jobs", params={"limit": 200, "offset": offset}).json()
        jobs += page["jobs"]
        offset += len(page["jobs"])
        if offset >= page["total"] or not page["jobs"]:
            break
    shown = [http.get(f"/v1/jobs/{job['id']}").json() for job in jobs]
    states: dict[str, int] = {}
    for job in shown:
        states[job["status"]] = states.get(job["status"], 0) + 1
    waits = {name: [stamp(j["timestamps"].get("pending")) - stamp(j["timestamps"]["queued"])
                    for j in shown if j["owner"] == name] for name in users}
    # the contended window: the instants (every 0.1 s) at which every user had a job waiting in the queue; each
    # user's slot-seconds (learners running) summed over those instants only
    now = time.time()  # a job still queued (a run stopped at --deadline) waits until now
    spans = [(j["owner"], stamp(j["timestamps"]["queued"]), stamp(j["timestamps"].get("pending") or now))
             for j in shown]
    runs = [(j["owner"], stamp(a["started_at"]), stamp(a["ended_at"]), j["learners"])
            for j in shown for a in j["attempts"]]
    used, window = dict.fromkeys(users, 0.0), 0.0
    t, last = min(q for _, q, _ in spans), max(p for _, _, p in spans)
    while t < last:
        waiting = {owner for owner, queued, pending in spans if queued <= t < pending}
        if waiting >= set(users):
            window += STEP
            for owner, start, stop, learners in runs:
                if start <= t < stop:
                    used[owner] += STEP * learners
        t += STEP
    slots = [stop - start for _, start, stop, _ in runs if stop == stop and start == start]  # ended attempts
    return {"jobs": len(shown), "states": states, "waits": waits, "window": window, "used": used, "slot_s": slots}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def report(args, wall: float, record, flooded: dict[int, int], result: dict, rss: list[int],
           names: list[str]) -> None:
    total = args.users * args.jobs_per_user + args.greedy_jobs
    work = "one epoch of training" if args.train else f"{args.job_seconds:.1f} s"
    print(f"{len(names)} users ({args.users} + greedy), {total} jobs of {work}, {args.slots} slots, "
          f"{args.database}, {'RabbitMQ' if args.amqp else 'embedded broker'}: {wall:.0f} s wall")
    for kind in ("list", "show", "submit", "page", "register", "session"):
        values = record.seconds.get(kind, [])
        print(f"  {kind:7s} n={len(values):5d}  p50 {1000 * pct(values, 50):7.1f} ms  "
              f"p99 {1000 * pct(values, 99):7.1f} ms")
    errors = sum(n for code, n in record.codes.items() if code >= 500 or code < 0)
    print(f"  answers {dict(sorted(record.codes.items()))}; 5xx or no answer: {errors}")
    print(f"  jobs: {result['jobs']} of {total} submitted, states {result['states']}")
    waits = result["waits"]
    means = {name: statistics.mean(values) for name, values in waits.items() if values}
    print(f"  queue wait per user, mean s: min {min(means.values()):.1f}, median "
          f"{statistics.median(means.values()):.1f}, max {max(means.values()):.1f}; "
          f"greedy {means.get('greedy', 0):.1f}")
    used = result["used"]
    print(f"  contended window {result['window']:.0f} s: slot-seconds per user min {min(used.values()):.1f}, "
          f"max {max(used.values()):.1f} (greedy {used['greedy']:.1f}); Jain's index {jain(list(used.values())):.3f}")
    slots = result["slot_s"]
    if slots:  # what a job costs the slots under this load: the full run's time is about jobs x mean / slots
        print(f"  slot time per attempt (learner started -> ended): p50 {pct(slots, 50):.1f} s, p90 "
              f"{pct(slots, 90):.1f} s, max {max(slots):.1f} s, mean {statistics.mean(slots):.1f} s: 200 jobs on "
              f"{args.slots} slots ~{200 * statistics.mean(slots) / args.slots / 60:.1f} min at this load")
    print(f"  manager RSS: start {rss[0] / 2**20:.0f} MiB, end {rss[-1] / 2**20:.0f} MiB, "
          f"peak {max(rss) / 2**20:.0f} MiB")
    if result["sessions"]:
        states = {}
        for entry in result["sessions"]:
            states[entry["status"]] = states.get(entry["status"], 0) + 1
        seconds = [e["seconds"] for e in result["sessions"] if e["status"] == "completed"]
        print(f"  feature sessions: {len(result['sessions'])}, states {states}; start to end "
              f"median {pct(seconds, 50):.0f} s, max {max(seconds, default=float('nan')):.0f} s")
    print(f"  wrong-token flood: {sum(flooded.values())} requests ({sum(flooded.values()) / wall:.0f}/s), "
          f"answers {dict(sorted(flooded.items()))}")


def figures(wall: float, record, flooded: dict[int, int], result: dict, rss: list[int]) -> dict:
    """The run's figures as a JSON-ready object (the CI-sized test reads it): wall seconds, the users' answers by
    status code and the 5xx-or-unanswered count, the jobs' states, Jain's index and the contended window, the
    flood's answers, the manager's RSS (start, end, peak; bytes), the sessions and the latencies (ms) by kind."""
    errors = sum(n for code, n in record.codes.items() if code >= 500 or code < 0)
    return {
        "wall_s": wall, "codes": record.codes, "errors": errors, "jobs": result["jobs"],
        "states": result["states"], "jain": jain(list(result["used"].values())), "window_s": result["window"],
        "flood": flooded, "rss": [rss[0], rss[-1], max(rss)], "sessions": result["sessions"],
        "slot_s": {"p50": pct(result["slot_s"], 50), "p90": pct(result["slot_s"], 90),
                   "mean": statistics.mean(result["slot_s"]) if result["slot_s"] else float("nan"),
                   "n": len(result["slot_s"])},
        "rss_mib_every_30s": [round(r / 2**20, 1) for r in rss[::30]],
        "latency_ms": {kind: {"p50": 1000 * pct(v, 50), "p99": 1000 * pct(v, 99), "n": len(v)}
                       for kind, v in record.seconds.items()}}
