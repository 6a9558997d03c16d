"""Benchmark: a session's and a training job's figures under the real Docker engine next to the local launcher's
(issue 21), side by side in this process.

    .venv/bin/python bench/docker_launchers.py [--tones N] [--epochs E] [--rounds R] [--downpour] [--no-session]

Needs the engine, the one-node swarm and the image of ``bash .ci/docker`` (labswarm:ci), the host's RabbitMQ.
Each round runs, alternating:

- a session of the contract tests' experiment (``N`` tones x 3 transformations, mel and MFCC; tests/docker/
  host_manager.py) with 2 workers: ``labswarm worker`` processes on the host started beside the manager (the local
  baseline: the same command the worker containers run), then the swarm launcher's 2-replica service. Reported:
  seconds from the session's start to its first outcome and to its end, and samples/s over the whole session;
- a training job of the tiny three-class manifest (tests/jobs/tiny.py, ``E`` epochs): the local job launcher (a
  learner process) then the swarm job launcher (a learner service). Reported: seconds from the POST to
  ``completed``. With ``--downpour`` the job is distributed: ``downpour`` with 2 learners and 1 parameter-server
  shard (1 torch thread each), local processes or 3 services on the host network (the shard on a port of its own).
  ``--no-session``: the jobs only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "docker"), str(ROOT / "tests")]

import httpx  # noqa: E402
from engine import BROKER, IMAGE, TOKEN, free_port  # noqa: E402
from host_manager import HostManager  # noqa: E402
from jobs.tiny import tiny_manifest  # noqa: E402

from labswarm.manager.api import create_app  # noqa: E402
from labswarm.manager.server import EmbeddedServer  # noqa: E402
from labswarm.settings import Settings  # noqa: E402


def shared_folder() -> Path:
    path = Path(tempfile.mkdtemp(prefix="labswarm-bench-docker-"))
    path.chmod(0o755)
    return path


def session(launcher: str, tones: int) -> dict[str, float]:
    """One session with 2 workers; ``launcher``: ``local`` (worker processes here) or ``swarm``."""
    m = HostManager(shared_folder(), IMAGE, tones=tones)
    workers: list[subprocess.Popen] = []
    try:
        start = time.monotonic()
        if launcher == "swarm":
            m.start(workers=2)
        else:
            m.session_id = m.client.start_session(m.name)["id"]
            env = {**os.environ, "LABSWARM_BROKER_URL": BROKER, "LABSWARM_API_TOKEN": TOKEN}
            workers = [subprocess.Popen([sys.executable, "-m", "labswarm.cli", "worker", "--experiment", m.name,
                                         "--manager", m.url, "--concurrency", "1"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
        first = m.wait_progress("a first outcome", lambda p: p["finished"] >= 1)
        first_s = time.monotonic() - start
        done = m.wait_progress("the end", lambda p: p["status"] == "completed")
        end_s = time.monotonic() - start
        assert done["done"] == m.total, done
        return {"first outcome s": first_s, "end s": end_s, "samples/s": m.total / end_s,
                "after first": (m.total - first["finished"]) / (end_s - first_s)}
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(60)
        m.close()


def job(launcher: str, epochs: int, downpour: bool = False) -> dict[str, float]:
    """One tiny training job; ``launcher``: the job launcher (``local`` or ``swarm``); ``downpour``: 2 learners
    and 1 shard."""
    shared = shared_folder()
    for folder in ("store", "results", ".labswarm-jobs"):  # the last: the swarm shards' checkpoints
        (shared / folder).mkdir(mode=0o777)
        (shared / folder).chmod(0o777)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    manifest = tiny_manifest(shared, epochs=epochs)
    if downpour:
        manifest = tiny_manifest(shared, epochs=epochs, learners=2, framework={"name": "downpour"}, ps_shards=1)
        manifest["training"]["threads"] = 1
    settings = Settings(home=shared / "home", data_roots=[str(shared)], job_launcher=launcher, job_slots=2,
                        swarm_image=IMAGE, swarm_network="host", swarm_manager_url=url,
                        swarm_data_volume=str(shared), swarm_data_target=str(shared))
    with EmbeddedServer(create_app(settings), port=port), httpx.Client(base_url=url, timeout=60) as http:
        start = time.monotonic()
        job_id = http.post("/v1/jobs", json=manifest).json()["id"]
        while (status := http.get(f"/v1/jobs/{job_id}").json()["status"]) not in ("completed", "failed"):
            time.sleep(0.5)
        assert status == "completed", status
        return {("downpour job s" if downpour else "job s"): time.monotonic() - start}


def main() -> None:
    # the experiments and manifests live in temporary folders (as tests/conftest.py allows them)
    os.environ.setdefault("LABSWARM_DATA_ROOTS", json.dumps([os.getcwd(), os.path.realpath(tempfile.gettempdir())]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tones", type=int, default=32, help="tones of the session's experiment (3 samples each)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the tiny training job")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--downpour", action="store_true", help="the job: downpour, 2 learners and 1 shard")
    parser.add_argument("--no-session", action="store_true", help="the job only, no session")
    args = parser.parse_args()
    for r in range(args.rounds):
        for launcher in ("local", "swarm"):
            figures = {**({} if args.no_session else session(launcher, args.tones)),
                       **job(launcher, args.epochs, args.downpour)}
            print(f"round {r + 1} {launcher}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
