"""``labswarm compare --hosts`` over namespace hosts, as a user runs it across machines (the CLI in its own
process): a 2-learner ``downpour`` job, learners on hosts ``b`` and ``c``, the shard on ``d`` (the last host),
through ``--host-command 'ip netns exec {host}'``; the manager and coordinator on the gateway (``--address``).

Each learner ran on its host: each of ``b`` and ``c`` sent at least the gradients its learner counted
(``CommStats``) on its own link (a learner left on this machine would send nothing there), and ``d``'s link
carried the shard's answers. One epoch of the tiny three-class set: ~40 s quiet, longer under load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import missing
from train.three_classes import training_experiment, write_three_classes

from labswarm.netns import GATEWAY, Cluster

#: serial: the gateway address is one per machine (see test_worker_link_cut.py); slow: real learner processes
pytestmark = [pytest.mark.cluster, pytest.mark.serial, pytest.mark.slow]

if os.geteuid() != 0:
    missing("network namespaces need root")


def test_compare_hosts_runs_each_learner_and_the_shard_on_its_host(tmp_path: Path) -> None:
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(write_three_classes(tmp_path / "data"),
                                                             tmp_path / "store")))
    out = tmp_path / "out"
    with Cluster(["b", "c", "d"], gateway=True) as cluster:
        hosts = ",".join(f"{cluster.host(h).netns}={cluster.address(h)}" for h in ("b", "c", "d"))
        before = {h: cluster.counters(h) for h in ("b", "c", "d")}
        result = subprocess.run(
            [str(Path(sys.executable).with_name("labswarm")), "compare", str(experiment), "--frameworks", "downpour",
             "--learners", "2", "--epochs", "1", "--target", "0.1", "--output", str(out), "--hosts", hosts,
             "--host-command", "ip netns exec {host}", "--address", GATEWAY, "--gloo-ifname", "eth0"],
            capture_output=True, text=True, timeout=600, check=False)
        sent = {h: cluster.counters(h)[0] - before[h][0] for h in ("b", "c", "d")}
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = json.loads((out / "compare.json").read_text())
    assert list(saved["hosts"]) == [cluster.host(h).netns for h in ("b", "c", "d")]
    [row] = saved["rows"]
    assert (row["framework"], row["learners"]) == ("downpour", 2)
    assert [e["samples"] for e in row["epochs"]] == [36]  # every training sample once
    counted = row["bytes_sent_per_learner"]
    assert counted > 0, row
    for host in ("b", "c"):  # each learner's gradients left through its own host's link
        assert sent[host] >= 0.9 * counted, (sent, counted)
    assert sent["d"] >= 0.1 * counted, (sent, counted)  # the shard answers from d (its parameters)
