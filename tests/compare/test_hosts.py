"""``labswarm compare --hosts`` without a cluster: the placement (learner r on host r mod N, the shards on the
last), the command a placed process runs (really run, through ``env`` as the host command: the variables come from
its env file, the interpreter is exec'd in place), and bad input refused with exit 2 naming the option. The
comparison over namespace hosts: tests/netns/test_compare_hosts.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from train.three_classes import training_experiment, write_three_classes
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.compare.hosts import ENV_MODULE, SHARD_PORT, HostShards, parse_hosts
from labswarm.deploy.learners import LearnerLaunch
from labswarm.errors import ConfigError, DeployError


def test_learners_go_round_the_hosts_and_each_runs_its_own_variables_through_the_host_command(tmp_path: Path) -> None:
    hosts = parse_hosts("b=10.0.0.2, c", "10.0.0.1", "env PLACED={host}@{address}", env={"GLOO_SOCKET_IFNAME": "e0"})
    assert hosts.names == ("b", "c") and hosts.addresses == ("10.0.0.2", "c")
    assert [hosts.learner_host(r) for r in range(5)] == [0, 1, 0, 1, 0] and hosts.shard_host == 1
    names = "'PLACED', 'RANK', 'GLOO_SOCKET_IFNAME', 'PYTHONPATH', 'PATH'"
    (tmp_path / "probe.py").write_text(f"import json, os\nprint(json.dumps({{k: os.environ.get(k) for k in "
                                       f"({names})}}), os.getpid())\n")
    spec = tmp_path / "jobs" / "j" / "learner-1.json"
    launch = LearnerLaunch("j", 1, 1, {}, spec, tmp_path / "out", "token")
    env = {**os.environ, "RANK": "1", "PYTHONPATH": str(tmp_path)}
    argv = hosts.place_learner(launch, [sys.executable, "-m", "probe"], env)
    env_file = spec.with_suffix(".env")
    assert argv == ["env", "PLACED=c@c", sys.executable, "-m", ENV_MODULE, str(env_file), "-m", "probe"]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # the attempt's token is among them
    assert json.loads(env_file.read_text()) == {"RANK": "1", "PYTHONPATH": str(tmp_path), "GLOO_SOCKET_IFNAME": "e0"}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)  # the host's own environment: not env's
    out, _ = process.communicate(timeout=60)
    seen, pid = out.rsplit(" ", 1)
    assert json.loads(seen) == {"PLACED": "c@c", "RANK": "1", "GLOO_SOCKET_IFNAME": "e0",
                                "PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]}
    assert int(pid) == process.pid  # env and the shim exec in place: a kill of the launcher's pid reaches it
    shards = HostShards("j", tmp_path / "home" / "j", hosts)
    assert shards.address(1) == ("c", SHARD_PORT + 1) and shards.master_host == "10.0.0.1"
    with pytest.raises(DeployError, match="remote shell"):  # ssh would split it
        hosts.on(0, [sys.executable, "-m", "probe", "a b"], {}, tmp_path / "x.env")


@pytest.mark.parametrize(("hosts", "command", "address", "field", "why"), [
    ("", "ssh {host}", "10.0.0.1", "hosts", "at least one host"),
    ("b,,c", "ssh {host}", "10.0.0.1", "hosts", "empty host"),
    ("b,b", "ssh {host}", "10.0.0.1", "hosts", "named twice"),
    ("b=", "ssh {host}", "10.0.0.1", "hosts", "empty host"),
    ("b", "ssh {hots}", "10.0.0.1", "host-command", "unknown placeholder {hots}"),
    ("b", "ssh 'b", "10.0.0.1", "host-command", "does not parse"),
    ("b", "  ", "10.0.0.1", "host-command", "empty"),
    ("b", "ssh {host}", None, "address", "the hosts reach"),
])
def test_bad_hosts_name_their_option(hosts: str, command: str, address: str | None, field: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_hosts(hosts, address, command)
    [(name, reason)] = caught.value.errors
    assert name == field and why in reason, caught.value.errors


def test_the_cli_refuses_bad_hosts_with_exit_2_before_any_job(tmp_path: Path) -> None:
    experiment = tmp_path / "experiment.yml"
    experiment.write_text(yaml.safe_dump(training_experiment(write_three_classes(tmp_path / "data", per_class=2),
                                                             tmp_path / "store")))
    base = ["compare", str(experiment), "--output", str(tmp_path / "out")]
    for args, words in ((["--hosts", ""], ["hosts"]),
                        (["--hosts", "b", "--address", "10.0.0.1", "--host-command", "ssh {user}@{host}"],
                         ["host-command", "{user}"]),
                        (["--hosts", "b,c"], ["address"]),
                        (["--hosts", "b", "--address", "10.0.0.1", "--manager", "http://127.0.0.1:9"], ["hosts"])):
        result = CliRunner().invoke(app, [*base, *args])
        assert result.exit_code == 2, (args, result.output)
        assert all(w in result.output for w in words), (args, result.output)
    assert not (tmp_path / "out").exists()  # nothing started
