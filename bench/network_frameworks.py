"""Benchmark (issue 22 item 3): the training frameworks over the network, each learner and shard on its own host
(:class:`labswarm.netns.Cluster`, root only), for each link profile.

    sudo .venv/bin/python bench/network_frameworks.py [--experiment examples/music_speech_noise.yml] [--epochs 1]
        [--framework NAME[:key=value,...]]... [--profile loopback --profile lan ...] [--target 0.8]
        [--output docs/network] [--workdir DIR] [--replot]

Hosts ``b`` and ``c`` run the learners (rank 0 and 1, one torch thread each), ``d`` the parameter-server shard of
the frameworks that have one; every host's link is shaped by the profile (``loopback`` unshaped, ``lan`` 1 Gbit/s,
``campus`` 100 Mbit/s, ``wan`` 20 Mbit/s: tbf, no added latency: ``netem`` is not in this kernel). The manager
(the job's coordinator store included) is served in this process on the gateway ``198.18.0.1``; the filesystem is
shared (the features are read from disk, not over the links). Jobs run one after another, as ``labswarm compare``
runs them (:func:`labswarm.compare.run.job_manifest`, :func:`~labswarm.compare.run.run_job`), with the same
figures (:func:`~labswarm.compare.report.summarize`), plus the bytes each learner's host sent on its link (the
veth's ``tx_bytes``: Ethernet frames, the learner's reports to the manager and its store traffic included) beside
what the learners count themselves (``CommStats``: message payloads), and ``job_s``: the job from submit to its
last event (start-up included; ``wall_s`` is the training only).

Written: ``network.json`` (every row), ``network.md`` (the table), ``network.png`` (samples/s and time to the
target against link bandwidth, one line per framework).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from labswarm.compare.report import rank_records, summarize
from labswarm.compare.run import job_manifest, parse_frameworks, run_job
from labswarm.netns import GATEWAY, PROFILES, Cluster

ROOT = Path(__file__).resolve().parents[1]
#: Where each rank's learner runs, and the shards.
LEARNER_HOSTS, SHARD_HOST = {0: "b", 1: "c"}, "d"
#: Link rate drawn for ``loopback`` (unshaped: one TCP stream measured 7,200 Mbit/s between two hosts here).
LOOPBACK_MBIT = 7200.0


def place(cluster: Cluster, jobs: Any) -> None:
    """Make the embedded manager's local launcher start rank ``r`` on ``LEARNER_HOSTS[r]`` (gloo on its ``eth0``)
    and a job's shards on :data:`SHARD_HOST` (the coordinator stays on the gateway), with the placement of
    ``labswarm compare --hosts`` (:mod:`labswarm.compare.hosts`, ``ip netns exec {host}`` as the host command)."""
    from labswarm.compare.hosts import parse_hosts
    from labswarm.compare.hosts import place as place_on

    hosts = [*LEARNER_HOSTS.values(), SHARD_HOST]  # rank r on hosts[r], the shards on the last
    place_on(jobs.lifecycle.learners, parse_hosts([f"{cluster.host(h).netns}={cluster.address(h)}" for h in hosts],
                                                  GATEWAY, "ip netns exec {host}", env={"GLOO_SOCKET_IFNAME": "eth0"}),
             jobs.runtime.home)


def run_profile(profile: str, workload: dict[str, Any], frameworks: list[dict[str, Any]], args: argparse.Namespace,
                data_roots: list[str]) -> list[dict[str, Any]]:
    """Every framework's job on a fresh cluster whose links are shaped by ``profile``; returns their rows."""
    from labswarm.jobs.client.client import JobsClient
    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer
    from labswarm.settings import Settings

    workdir = args.workdir / profile
    token = uuid.uuid4().hex
    rows = []
    with Cluster([*LEARNER_HOSTS.values(), SHARD_HOST], profile=profile, gateway=True) as cluster:
        settings = Settings(home=workdir / "manager", database_url=None, broker_url=None, tokens_file=None,
                            api_token=token, data_roots=[*data_roots, str(workdir)], job_slots=2,
                            job_launcher="local")
        (workdir / "manager").mkdir(parents=True, exist_ok=True)
        app = create_app(settings)
        server = EmbeddedServer(app, host=GATEWAY).start()
        try:
            place(cluster, app.state.jobs)
            with JobsClient(server.url, token) as client:
                for fw in frameworks:
                    manifest = job_manifest(workload, fw, 2, workdir / "results", args.epochs, 1, 1)
                    before = {h: cluster.counters(h)[0] for h in LEARNER_HOSTS.values()}
                    started = time.monotonic()
                    events = run_job(client, manifest)
                    wall = time.monotonic() - started
                    sent = [cluster.counters(h)[0] - before[h] for h in LEARNER_HOSTS.values()]
                    row = summarize(fw["name"], rank_records(events, 2), args.target, params=fw)
                    row.update(profile=profile, link_mbit=(PROFILES[profile] or LOOPBACK_MBIT * 1e6) / 1e6,
                               wire_sent_per_learner=sum(sent) / len(sent), job_s=wall)
                    rows.append(row)
                    print(f"{profile:9s} {fw['name']:16s} {row['samples_per_s']:7.1f} samples/s  "
                          f"wire {row['wire_sent_per_learner'] / 1e6:7.2f} MB/learner  CommStats "
                          f"{row['bytes_sent_per_learner'] / 1e6:7.2f} MB  acc {row['final_val_accuracy']}  "
                          f"wall {wall:.0f} s", flush=True)
        finally:
            server.stop()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| profile | framework | samples/s | time to target (s) | final val acc | wire MB / learner | "
             "CommStats MB / learner | wire / CommStats | staleness p50 / p99 | job (s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        acc = "-" if r["final_val_accuracy"] is None else f"{r['final_val_accuracy']:.3f}"
        ratio = r["wire_sent_per_learner"] / r["bytes_sent_per_learner"] if r["bytes_sent_per_learner"] else None
        stale = f"{r['staleness_p50']} / {r['staleness_p99']}" if "staleness_p50" in r else "-"
        lines.append(f"| {r['profile']} | {r.get('label', r['framework']).rsplit(' ×', 1)[0]} | "
                     f"{r['samples_per_s']:.1f} | {ttt} | {acc} | {r['wire_sent_per_learner'] / 1e6:.2f} | "
                     f"{r['bytes_sent_per_learner'] / 1e6:.2f} | {'-' if ratio is None else f'{ratio:.3f}'} | "
                     f"{stale} | {r['job_s']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], output: Path) -> Path:
    """``network.png``: samples/s and time to the target against the link rate (log axis), a line per framework."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = dict.fromkeys(r["framework"] for r in rows)
    for name in names:
        mine = sorted((r for r in rows if r["framework"] == name), key=lambda r: r["link_mbit"])
        xs = [r["link_mbit"] for r in mine]
        axes[0].plot(xs, [r["samples_per_s"] for r in mine], marker="o", label=name)
        axes[1].plot(xs, [math.nan if r["time_to_target_s"] is None else r["time_to_target_s"] for r in mine],
                     marker="o", label=name)  # not reached: a gap
    for ax, title in zip(axes, ("samples/s", "time to target (s)"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Mbit/s; loopback drawn at its measured 7,200)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = output / "network.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=ROOT / "examples" / "music_speech_noise.yml")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--framework", action="append", default=[])
    parser.add_argument("--profile", action="append", default=[])
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "network")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--replot", action="store_true",
                        help="write network.md and network.png again from --output's network.json (no run)")
    args = parser.parse_args()
    if args.replot:
        rows = json.loads((args.output / "network.json").read_text())["rows"]
        (args.output / "network.md").write_text(table(rows))
        print(table(rows), plot(rows, args.output))
        return 0
    if os.geteuid() != 0:
        print("network namespaces need root", file=sys.stderr)
        return 2
    from labswarm.config.experiment import load_experiment
    from labswarm.config.roots import experiment_folders

    frameworks = parse_frameworks(args.framework or ["allreduce", "downpour"])
    profiles = args.profile or list(PROFILES)
    config = load_experiment(args.experiment)
    args.output = args.output.resolve()
    args.workdir = (args.workdir or Path(f"/tmp/labswarm-network-{uuid.uuid4().hex[:6]}")).resolve()
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows = [row for profile in profiles
            for row in run_profile(profile, config.model_dump(mode="json"), frameworks, args,
                                   [str(p) for p in experiment_folders(config)])]
    print(f"load average after: {os.getloadavg()}")
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "network.json").write_text(json.dumps({
        "experiment": str(args.experiment), "epochs": args.epochs, "frameworks": frameworks, "profiles": profiles,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg(), "rows": rows},
        indent=1, default=str))
    (args.output / "network.md").write_text(table(rows))
    plot(rows, args.output)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
