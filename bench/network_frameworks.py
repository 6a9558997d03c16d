"""Benchmark (issue 22 item 3): the training frameworks over the network, each learner and shard on its own host
(:class:`labswarm.netns.Cluster`, root only), for each link profile.

    sudo .venv/bin/python bench/network_frameworks.py [--experiment examples/music_speech_noise.yml] [--epochs 2]
        [--framework NAME[:key=value,...]]... [--profile loopback --profile lan ...] [--target 0.8]
        [--model key=value]... [--output docs/network] [--workdir DIR] [--replot]

Hosts ``b`` and ``c`` run the learners (rank 0 and 1, one torch thread each), ``d`` the parameter-server shard of
the frameworks that have one; every host's link is shaped by the profile (``loopback`` unshaped, ``lan`` 1 Gbit/s,
``campus`` 100 Mbit/s, ``wan`` 20 Mbit/s: tbf, no added latency: ``netem`` is not in this kernel). The manager
(the job's coordinator store included) is served in this process on the gateway ``198.18.0.1``; the filesystem is
shared (the features are read from disk, not over the links). Jobs run one after another, as ``labswarm compare``
runs them (:func:`labswarm.compare.run.job_manifest`, :func:`~labswarm.compare.run.run_job`), with the same
figures (:func:`~labswarm.compare.report.summarize`), plus the bytes each learner's host sent on its link (the
veth's ``tx_bytes``: Ethernet frames, the learner's reports to the manager and its store traffic included) beside
what the learners count themselves (``CommStats``: message payloads), and ``job_s``: the job from submit to its
last event (start-up included; ``wall_s`` is the training only, from the job's ``running`` status).

The model: the experiment's, with ``--model key=value`` overrides (values read as YAML). Without any, the bench
trains the demo's CNN with a fifth block of 256 channels (:data:`DEFAULT_MODEL`, on 8 × 8 maps after the pools):
212 k parameters, 0.85 MB a message against the demo CNN's 0.25 MB, for 1.2x its compute (11.0 against 9.2 GFLOP
a 32-sample step): one step's gradients take ~0.34 s at 20 Mbit/s, about a step's compute on one core (~0.3 s),
so the links separate the frameworks (the demo CNN's 0.1 s did not: docs/benchmarks/network.md).
``--model channels=[16,32,64,64]`` trains the demo's own CNN, ``channels=[16,32,64,64,512]`` a larger one
(363 k parameters, 1.45 MB, 1.4x the compute).

Written into ``--output``: ``network.json`` (every row and the run's settings), ``network.md`` (the tables:
samples/s, time to the target and final accuracy per framework and profile, then every row's figures),
``network.png`` (samples/s and time to the target against the link rate, a line per framework) and
``accuracy.png`` (validation accuracy against wall time, a panel per profile, a line per framework).
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

import yaml

from labswarm.compare.report import rank_records, summarize
from labswarm.compare.run import job_manifest, parse_frameworks, run_job
from labswarm.errors import ConfigError
from labswarm.netns import GATEWAY, PROFILES, Cluster

ROOT = Path(__file__).resolve().parents[1]
#: Where each rank's learner runs, and the shards.
LEARNER_HOSTS, SHARD_HOST = {0: "b", 1: "c"}, "d"
#: Link rate drawn for ``loopback`` (unshaped: one TCP stream measured 7,200 Mbit/s between two hosts here).
LOOPBACK_MBIT = 7200.0
#: The frameworks run when none is named: issue 22's comparison (all-reduce against averaging and asynchronous).
DEFAULT_FRAMEWORKS = ("allreduce", "model_averaging", "downpour", "easgd")
#: Each framework's ``timeout_s`` (s a collective, a shard request or a wait for a peer may take) unless its spec
#: sets one: the default 30 s was passed by rank 0 waiting for rank 1's half of the validation on a machine at load
#: 28 (the job then restarts as a new attempt, which is no figure of the network); a link cut is not measured here.
TIMEOUT_S = 600.0
#: The model overrides used when no ``--model`` is given (module docstring: why).
DEFAULT_MODEL = {"channels": [16, 32, 64, 64, 256]}


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


def run_profile(profile: str, manifests: list[tuple[dict[str, Any], dict[str, Any]]], args: argparse.Namespace,
                data_roots: list[str]) -> list[dict[str, Any]]:
    """Every ``(framework, manifest)``'s job on a fresh cluster whose links are shaped by ``profile``; their rows."""
    from labswarm.jobs.client.client import JobsClient
    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer
    from labswarm.settings import Settings

    workdir = args.workdir / profile
    token = uuid.uuid4().hex
    rows = []
    hosts = [*LEARNER_HOSTS.values(), SHARD_HOST]
    with Cluster(hosts, profile=profile, gateway=True) as cluster:
        settings = Settings(home=workdir / "manager", database_url=None, broker_url=None, tokens_file=None,
                            api_token=token, data_roots=[*data_roots, str(workdir)], job_slots=2,
                            job_launcher="local")
        (workdir / "manager").mkdir(parents=True, exist_ok=True)
        app = create_app(settings)
        server = EmbeddedServer(app, host=GATEWAY).start()
        try:
            place(cluster, app.state.jobs)
            with JobsClient(server.url, token) as client:
                for fw, manifest in manifests:
                    manifest = {**manifest, "results_store": {"name": "local", "path": str(workdir / "results")}}
                    before = {h: cluster.counters(h)[0] for h in hosts}
                    started = time.monotonic()
                    events = run_job(client, manifest)
                    took = time.monotonic() - started
                    sent = {h: cluster.counters(h)[0] - before[h] for h in hosts}
                    row = summarize(fw["name"], rank_records(events, 2), args.target, params=fw)
                    row.update(profile=profile, link_mbit=(PROFILES[profile] or LOOPBACK_MBIT * 1e6) / 1e6,
                               wire_sent_per_learner=sum(sent[h] for h in LEARNER_HOSTS.values()) / 2,
                               wire_sent_shard=sent[SHARD_HOST], job_s=took)
                    rows.append(row)
                    args.took.append(took)
                    print(f"{profile:9s} {name(row):24s} {row['samples_per_s']:7.1f} samples/s  "
                          f"wire {row['wire_sent_per_learner'] / 1e6:7.2f} MB/learner  CommStats "
                          f"{row['bytes_sent_per_learner'] / 1e6:7.2f} MB  acc {row['final_val_accuracy']}  "
                          f"to target {row['time_to_target_s']}  job {took:.0f} s  load {os.getloadavg()[0]:.1f}  ~"
                          f"{(args.jobs - len(args.took)) * sum(args.took) / len(args.took) / 60:.0f} min left",
                          flush=True)
        finally:
            server.stop()
    return rows


def name(row: dict[str, Any]) -> str:
    """A row's framework with its parameters (``model_averaging(period=8)``), without the learner count."""
    return str(row.get("label", row["framework"])).rsplit(" ×", 1)[0]


def matrix(rows: list[dict[str, Any]], cell: Any) -> list[str]:
    """A Markdown table of ``cell(row)`` with a line per framework and a column per profile (run order)."""
    profiles, names = list(dict.fromkeys(r["profile"] for r in rows)), list(dict.fromkeys(map(name, rows)))
    got = {(name(r), r["profile"]): cell(r) for r in rows}
    lines = [f"| framework | {' | '.join(profiles)} |", f"|---|{'---:|' * len(profiles)}"]
    lines += [f"| {n} | {' | '.join(got.get((n, p), '') for p in profiles)} |" for n in names]
    return lines


def table(rows: list[dict[str, Any]], target: float | None = None) -> str:
    """The run's tables in Markdown: samples/s, time to the target and final accuracy per framework and profile,
    then every row's figures."""
    target = target if target is not None else (rows[0]["target"] if rows else 0.8)
    base = {name(r): r["samples_per_s"] for r in rows if r["profile"] == "loopback"}
    ratios = [r["wire_sent_per_learner"] / r["bytes_sent_per_learner"] for r in rows if r["bytes_sent_per_learner"]]
    lines = ["Training samples/s (both learners):", "", *matrix(rows, lambda r: f"{r['samples_per_s']:.1f}"), ""]
    if base:
        lines += ["The same, against the framework's own on `loopback`:", "",
                  *matrix(rows, lambda r: f"{r['samples_per_s'] / base[name(r)]:.2f}x" if base.get(name(r)) else ""),
                  ""]
    if ratios:
        lines += [f"Bytes the learners' hosts sent on their links against what the learners counted (`CommStats`): "
                  f"{min(ratios):.3f}-{max(ratios):.3f}.", ""]
    lines += [f"Time to validation accuracy {target} (s from the job's start of training; checked at each epoch's "
              "end):", "",
              *matrix(rows, lambda r: "not reached" if r["time_to_target_s"] is None
                      else f"{r['time_to_target_s']:.0f}"),
              "", "Final validation accuracy:", "",
              *matrix(rows, lambda r: "-" if r["final_val_accuracy"] is None else f"{r['final_val_accuracy']:.3f}"),
              "", "Every run:", "",
              "| profile | framework | samples/s | time to target (s) | final val acc | wire MB / learner | "
              "CommStats MB / learner | wire / CommStats | shard host MB | staleness p50 / p99 | training (s) | "
              "job (s) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        acc = "-" if r["final_val_accuracy"] is None else f"{r['final_val_accuracy']:.3f}"
        ratio = r["wire_sent_per_learner"] / r["bytes_sent_per_learner"] if r["bytes_sent_per_learner"] else None
        stale = f"{r['staleness_p50']} / {r['staleness_p99']}" if "staleness_p50" in r else "-"
        shard = f"{r['wire_sent_shard'] / 1e6:.2f}" if "wire_sent_shard" in r else "-"
        train = f"{r['wall_s']:.0f}" if r.get("wall_s") is not None else "-"
        lines.append(f"| {r['profile']} | {name(r)} | {r['samples_per_s']:.1f} | {ttt} | {acc} | "
                     f"{r['wire_sent_per_learner'] / 1e6:.2f} | {r['bytes_sent_per_learner'] / 1e6:.2f} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {shard} | {stale} | {train} | {r['job_s']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], output: Path) -> list[Path]:
    """``network.png``: samples/s and time to the target against the link rate (log axis), a line per framework;
    ``accuracy.png``: validation accuracy against wall time, a panel per profile, a line per framework, the target
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(map(name, rows)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for n in names:
        mine = sorted((r for r in rows if name(r) == n), key=lambda r: r["link_mbit"])
        xs = [r["link_mbit"] for r in mine]
        axes[0].plot(xs, [r["samples_per_s"] for r in mine], marker="o", label=n)
        axes[1].plot(xs, [math.nan if r["time_to_target_s"] is None else r["time_to_target_s"] for r in mine],
                     marker="o", label=n)  # not reached: a gap
    target = rows[0]["target"] if rows else None
    for ax, title in zip(axes, ("training samples/s", f"time to accuracy {target} (s)"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Mbit/s; loopback drawn at its measured 7,200)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [output / "network.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)

    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    fig, axes = plt.subplots(1, len(profiles), figsize=(4 * len(profiles), 3.6), sharex=True, sharey=True,
                             squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        for n in names:
            for r in (r for r in rows if r["profile"] == profile and name(r) == n):
                points = [e for e in r["epochs"] if e["val_accuracy"] is not None and e["elapsed_s"] is not None]
                ax.plot([0.0] + [e["elapsed_s"] for e in points], [math.nan] + [e["val_accuracy"] for e in points],
                        marker="o", label=n)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        rate = PROFILES[profile]
        ax.set_title(profile if rate is None else f"{profile} ({rate / 1e6:g} Mbit/s)")
        ax.set_xlabel("wall time since the job ran (s)")
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("validation accuracy")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(output / "accuracy.png")
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths


def write(run: dict[str, Any], output: Path) -> None:
    """``network.md`` (a line saying what ran, then :func:`table`) and the plots from ``run`` (``network.json``'s
    content) into ``output``; the Markdown printed."""
    rows = run["rows"]
    model = {k: v for k, v in (run.get("model") or {}).items() if k != "input"}
    loads = [f"{x[0]:.1f}" for x in (run.get("load_before"), run.get("load_after") or run.get("load")) if x]
    took = f", {run['took_s'] / 60:.0f} min in all" if run.get("took_s") else ""
    text = (f"Run of {run.get('when', '?')}: {run.get('epochs')} epoch(s) a job, model "
            f"`{json.dumps(model) if model else 'the experiment’s'}`, target {rows[0]['target'] if rows else '-'}, "
            f"load average {' → '.join(loads) or '?'}{took}.\n\n{table(rows)}")
    (output / "network.md").write_text(text)
    plot(rows, output)
    print(text)


def model_overrides(items: list[str]) -> dict[str, Any]:
    """``--model key=value`` items as a dict (values read as YAML); :data:`DEFAULT_MODEL` when none.

    Raises:
        ConfigError: an item without ``=`` (field ``model``).
    """
    if not items:
        return dict(DEFAULT_MODEL)
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError([("model", f"expected key=value, got {item!r}")])
        out[key.strip()] = yaml.safe_load(value)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=ROOT / "examples" / "music_speech_noise.yml")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per job (default 2)")
    parser.add_argument("--framework", action="append", default=[],
                        help=f"NAME[:key=value,...], repeated (default {', '.join(DEFAULT_FRAMEWORKS)})")
    parser.add_argument("--profile", action="append", default=[], choices=list(PROFILES),
                        help="repeated (default all four)")
    parser.add_argument("--model", action="append", default=[],
                        help=f"key=value override of the experiment's model block, repeated (default {DEFAULT_MODEL})")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "network")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--replot", action="store_true",
                        help="write network.md and the plots again from --output's network.json (no run)")
    args = parser.parse_args()
    if args.replot:
        write(json.loads((args.output / "network.json").read_text()), args.output)
        return 0
    from labswarm.config.experiment import load_experiment
    from labswarm.config.manifest import parse_manifest
    from labswarm.config.roots import experiment_folders

    try:
        if args.epochs < 1:
            raise ConfigError([("epochs", f"at least 1, got {args.epochs}")])
        frameworks = parse_frameworks(args.framework or list(DEFAULT_FRAMEWORKS))
        model = model_overrides(args.model)
        config = load_experiment(args.experiment)
        workload = config.model_dump(mode="json")
        workload["model"] = {**workload["model"], **model}
        manifests = [(fw, job_manifest(workload, {"timeout_s": TIMEOUT_S, **fw}, 2, Path("/results"), args.epochs,
                                       1, 1)) for fw in frameworks]
        for _, manifest in manifests:
            parse_manifest(manifest, source=f"job {manifest['name']}")  # every error before the first job
    except ConfigError as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("network namespaces need root", file=sys.stderr)
        return 2
    profiles = args.profile or list(PROFILES)
    args.output = args.output.resolve()
    args.workdir = (args.workdir or Path(f"/tmp/labswarm-network-{uuid.uuid4().hex[:6]}")).resolve()
    args.jobs, args.took = len(profiles) * len(manifests), []
    started, load = time.time(), os.getloadavg()
    print(f"load average before: {load}; model {workload['model']}", flush=True)
    rows = [row for profile in profiles
            for row in run_profile(profile, manifests, args, [str(p) for p in experiment_folders(config)])]
    print(f"load average after: {os.getloadavg()}; {time.time() - started:.0f} s in all")
    args.output.mkdir(parents=True, exist_ok=True)
    run = {
        "experiment": str(args.experiment), "epochs": args.epochs, "model": workload["model"],
        "frameworks": frameworks, "profiles": profiles, "target": args.target,
        "when": f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))}-"
                f"{time.strftime('%H:%M UTC', time.gmtime())}",
        "took_s": time.time() - started, "load_before": load, "load_after": os.getloadavg(), "rows": rows}
    (args.output / "network.json").write_text(json.dumps(run, indent=1, default=str))
    write(run, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
