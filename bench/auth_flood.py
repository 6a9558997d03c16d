"""Benchmark: a valid user's requests while a client floods wrong tokens (issue 26 item 5, "the API stays
responsive to valid users during a flood of bad tokens").

    .venv/bin/python bench/auth_flood.py [--rounds 3] [--seconds 10] [--clients 1] [--database sqlite|postgres]

A manager in a process of its own (SQLite, or a fresh schema on the PostgreSQL test server; bench/tenants.py's)
with two users, each with their own token. The valid user (``alice``) lists the jobs (``GET /v1/jobs``), one
request after another, in three phases of ``--seconds`` each, taken in turn ``--rounds`` times so that the
machine's other load falls on all three alike:

- ``quiet``: nobody else;
- ``wrong``: ``--clients`` clients each send wrong tokens of the issued shape (a different one each time, so each
  may cost a lookup of the attempts' tokens) as fast as they can;
- ``valid``: the same clients send the same request with a valid token (``bob``'s) as fast as they can: ordinary
  use at the flood's concurrency, the baseline a flood is held to.

Printed per phase: the valid user's latency p50 / p99 (ms) and request count, the other clients' requests per
second and their answers, and the p50 ratios. The stated bound (docs/benchmarks/tenants.md): under the wrong-token
flood the valid user's p50 is within 1.25x of its p50 under the same clients' valid requests, though the flood
sends more requests a second (a wrong token costs the manager no more than a right one: no lookup past the
per-address budget, a 429 instead); the lookups themselves are counted in tests/auth/test_failures.py. The
machine may be shared: compare the phases of one run, not runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from tenants import POSTGRES, SERVE

from labswarm.auth.tokens import add_token, new_token
from labswarm.manager.server import free_port

PHASES = ("quiet", "wrong", "valid")


def hammer(url: str, token: str | None, stop: threading.Event, codes: dict[int, int]) -> None:
    """``GET /v1/jobs`` as fast as one client can: with ``token``, or (None) a fresh wrong token each time."""
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                bearer = token if token is not None else new_token()
                status = http.get("/v1/jobs", headers={"Authorization": f"Bearer {bearer}"}).status_code
                codes[status] = codes.get(status, 0) + 1


def phase(url: str, alice: str, other: str | None, clients: int, seconds: float) -> tuple[list[float], dict, int]:
    """One phase: alice's latencies (s), the other clients' answers by status (``other``: ``"wrong"`` or a
    valid token; None: no other client) and alice's non-200 answers."""
    stop, codes, threads = threading.Event(), {}, []
    if other is not None:
        token = None if other == "wrong" else other
        threads = [threading.Thread(target=hammer, args=(url, token, stop, codes), daemon=True)
                   for _ in range(clients)]
    for thread in threads:
        thread.start()
    seconds_taken, failed = [], 0
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {alice}"}, timeout=60) as http:
        http.get("/v1/jobs")  # the connection opened outside the measured requests
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            status = http.get("/v1/jobs", params={"limit": 20}).status_code
            seconds_taken.append(time.perf_counter() - started)
            failed += status != 200
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    return seconds_taken, codes, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    parser.add_argument("--clients", type=int, default=1, help="the flood's (and the baseline's) clients")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        root = Path(tmp)
        alice, bob = (add_token(root / "tokens.yaml", name) for name in ("alice", "bob"))
        env = {"LABSWARM_HOME": str(root / "home"), "LABSWARM_TOKENS_FILE": str(root / "tokens.yaml")}
        schema, admin = None, None
        if args.database == "postgres":
            from sqlalchemy import create_engine, text

            schema, admin = f"bench_{uuid.uuid4().hex[:10]}", create_engine(POSTGRES)
            with admin.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA {schema}"))
            env["LABSWARM_DATABASE_URL"] = f"{POSTGRES}?options=-csearch_path%3D{schema}"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        manager = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env={**os.environ, **env})
        try:
            wait_up(url, manager)
            measure(args, url, alice, bob)
        finally:
            manager.terminate()
            manager.wait(60)
            if admin is not None:
                with admin.begin() as conn:
                    conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


def wait_up(url: str, manager: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and manager.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit("the manager did not start")


def measure(args, url: str, alice: str, bob: str) -> None:
    """The phases in turn, ``args.rounds`` times; the figures printed."""
    seconds: dict[str, list[float]] = {name: [] for name in PHASES}
    others: dict[str, dict[int, int]] = {name: {} for name in PHASES}
    failed = dict.fromkeys(PHASES, 0)
    for _ in range(args.rounds):
        for name, other in zip(PHASES, (None, "wrong", bob), strict=True):
            taken, codes, bad = phase(url, alice, other, args.clients, args.seconds)
            seconds[name] += taken
            failed[name] += bad
            for code, n in codes.items():
                others[name][code] = others[name].get(code, 0) + n
    span = args.rounds * args.seconds
    print(f"{args.database}, {args.clients} other client(s), {args.rounds} rounds of {args.seconds:.0f} s a phase")
    for name in PHASES:
        values = np.array(seconds[name]) * 1000
        print(f"  {name:5s}: valid user p50 {np.percentile(values, 50):6.1f} ms, p99 {np.percentile(values, 99):7.1f}"
              f" ms (n={values.size}, non-200: {failed[name]}); others {sum(others[name].values()) / span:5.0f}/s "
              f"{dict(sorted(others[name].items()))}")
    p50 = {name: float(np.percentile(seconds[name], 50)) for name in PHASES}
    print(f"  p50 ratios: wrong/quiet {p50['wrong'] / p50['quiet']:.2f}, wrong/valid {p50['wrong'] / p50['valid']:.2f}"
          f" (the bound: wrong/valid <= 1.25)")


if __name__ == "__main__":
    main()
