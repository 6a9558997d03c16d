"""The job manifest: every field wrong in turn names its path; credentials never show; defaults, paths,
overrides and the shipped example."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from labswarm.config.experiment import load_experiment
from labswarm.errors import ConfigError
from labswarm.jobs import (
    DEFAULT_USER_EXIT_CODES,
    CommandFramework,
    JobManifest,
    LabswarmFramework,
    load_manifest,
    parse_manifest,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "jobs" / "music_speech_noise.job.yml"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def inline_experiment() -> dict[str, Any]:
    return {
        "name": "tones",
        "dataset": {"root": "data", "sample_rate": 16000},
        "features": [{"name": "mel", "n_mels": 32}],
        "store": {"root": "store"},
        "model": {"name": "cnn", "input": "mel"},
        "training": {"epochs": 4, "learning_rate": 0.01},
    }


def base() -> dict[str, Any]:
    return {"name": "job-1", "experiment": "music_speech_noise", "results_store": {"name": "local", "path": "out"}}


def errors_of(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_manifest(data)
    return caught.value


def test_a_minimal_manifest_gets_documented_defaults() -> None:
    manifest = parse_manifest(base())
    assert manifest.experiment == "music_speech_noise" == manifest.experiment_name
    assert manifest.training == {}
    assert manifest.learners == 1
    assert (manifest.resources.cpus, manifest.resources.gpus, manifest.resources.memory_mb) == (1.0, 0, 4096)
    assert manifest.framework == LabswarmFramework()
    assert manifest.restart.max_restarts_platform == 3
    assert manifest.restart.max_restarts_user == 0
    assert manifest.restart.user_exit_codes == list(DEFAULT_USER_EXIT_CODES)
    assert manifest.priority == 0
    assert manifest.data_store is None
    assert manifest.results_store.name == "local"
    assert manifest.results_store.path == Path("out")  # kept as written without a base folder


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()

#: (field to set, value, the error paths expected). Each field wrong in turn, one at a time.
WRONG = [
    ("name", "Bad Name", ["name"]),
    ("name", _DELETE, ["name"]),
    ("description", 3, ["description"]),
    ("experiment", "Not A Name!", ["experiment"]),
    ("experiment", 5, ["experiment"]),
    ("experiment", _DELETE, ["experiment"]),
    ("experiment", {**inline_experiment(), "training": None}, ["experiment.training"]),
    ("experiment", {k: v for k, v in inline_experiment().items() if k not in ("model", "training")},
     ["experiment.model", "experiment.training"]),
    ("experiment", {**inline_experiment(), "features": [{"name": "mel", "n_mels": -1}]},
     ["experiment.features.0.n_mels"]),
    ("experiment", {**inline_experiment(), "model": {"name": "cnn", "input": "mfcc"}}, ["experiment.model"]),
    ("experiment", {**inline_experiment(), "colour": "red"}, ["experiment.colour"]),
    ("training", {"epochs": 0}, ["training.epochs"]),
    ("training", {"bogus": 1}, ["training.bogus"]),
    ("training", {"device": "tpu", "epochs": 2}, ["training.device"]),
    ("training", "fast", ["training"]),
    ("learners", 2, ["learners"]),
    ("learners", 0, ["learners"]),
    ("learners", "one", ["learners"]),
    ("resources", "big", ["resources"]),
    ("resources.cpus", 0, ["resources.cpus"]),
    ("resources.gpus", -1, ["resources.gpus"]),
    ("resources.memory_mb", "lots", ["resources.memory_mb"]),
    ("resources.disk_mb", 10, ["resources.disk_mb"]),
    ("framework", {"name": "tensorflow"}, ["framework.name"]),
    ("framework", {}, ["framework.name"]),
    ("framework", "labswarm", ["framework"]),
    ("framework", {"name": "labswarm", "command": ["python"]}, ["framework.command"]),
    ("framework", {"name": "command"}, ["framework.command"]),
    ("framework", {"name": "command", "command": []}, ["framework.command"]),
    ("framework", {"name": "command", "command": "   "}, ["framework.command"]),
    ("framework", {"name": "command", "command": 'echo "unbalanced'}, ["framework.command"]),
    ("framework", {"name": "command", "command": ["python", ""]}, ["framework.command.1"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {}}, ["framework.metrics"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {"jsonl": "m.jsonl", "regex": {"a": "(.)"}}},
     ["framework.metrics"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {"jsonl": "../m.jsonl"}},
     ["framework.metrics.jsonl"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {"jsonl": "/tmp/m.jsonl"}},
     ["framework.metrics.jsonl"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {"regex": {"loss": "loss=("}}},
     ["framework.metrics.regex.loss"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {"regex": {"loss": r"loss=\S+"}}},
     ["framework.metrics.regex.loss"]),
    ("framework", {"name": "command", "command": ["x"], "metrics": {"csv": "m.csv"}}, ["framework.metrics.csv"]),
    ("restart.max_restarts_platform", -1, ["restart.max_restarts_platform"]),
    ("restart.max_restarts_user", "never", ["restart.max_restarts_user"]),
    ("restart.backoff_s", "soon", ["restart.backoff_s"]),
    ("restart.backoff_max_s", 0.5, ["restart.backoff_max_s"]),  # below the default backoff_s (1 s)
    ("restart.user_exit_codes", [1, 0], ["restart.user_exit_codes.1"]),
    ("restart.user_exit_codes", [300], ["restart.user_exit_codes.0"]),
    ("restart.retries", 3, ["restart.retries"]),
    ("priority", "high", ["priority"]),
    ("priority", 10**6, ["priority"]),
    ("data_store", {"name": "ftp"}, ["data_store.name"]),
    ("data_store", "/data", ["data_store"]),
    ("results_store", _DELETE, ["results_store"]),
    ("results_store", {"name": "local"}, ["results_store.path"]),
    ("results_store", {"name": "local", "path": "out", "prefix": "../up"}, ["results_store.prefix"]),
    ("results_store", {"name": "local", "path": "out", "size": 1}, ["results_store.size"]),
    ("results_store", {"name": "s3", "bucket": "Bad_Bucket"}, ["results_store.bucket"]),
    ("results_store", {"name": "s3", "bucket": "results", "endpoint": "ftp://host"}, ["results_store.endpoint"]),
    ("gpus", 1, ["gpus"]),
]


@pytest.mark.parametrize(("field", "value", "paths"), WRONG, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(WRONG)])
def test_each_wrong_field_is_named_by_its_path(field: str, value: Any, paths: list[str]) -> None:
    error = errors_of(_set(base(), field, value))
    assert sorted(path for path, _ in error.errors) == sorted(paths), error
    for path in paths:
        assert f"{path}: " in str(error)


def test_the_same_errors_come_from_yaml_text() -> None:
    text = yaml.safe_dump(_set(base(), "restart.backoff_s", -1))
    with pytest.raises(ConfigError) as caught:
        load_manifest(text)
    assert [path for path, _ in caught.value.errors] == ["restart.backoff_s"]


def test_several_learners_need_a_distributed_framework() -> None:
    error = errors_of(_set(base(), "learners", 4))
    assert [path for path, _ in error.errors] == ["learners"] and "name a distributed framework" in str(error)


@pytest.mark.parametrize(("change", "path"), [
    ({"framework": {"name": "allreduse"}}, "framework.name"),
    ({"framework": {"name": "easgd", "tau": 0}}, "framework.tau"),
    ({"framework": {"name": "downpour", "n_pushh": 2}}, "framework.n_pushh"),
    ({"framework": {"name": "allreduce"}, "ps_shards": 2}, "ps_shards"),
    ({"framework": {"name": "sandblaster"}, "learners": 1}, "learners"),
    ({"framework": {"name": "labswarm"}, "ps_shards": 1, "learners": 1}, "ps_shards"),
    ({"framework": {"name": "downpour", "group_size": 3}}, "framework.group_size"),  # must divide learners: 2
])
def test_distributed_manifest_errors_name_the_field(change: dict[str, Any], path: str) -> None:
    error = errors_of({**base(), "learners": 2, **change})
    assert [p for p, _ in error.errors] == [path], error


def test_a_distributed_framework_keeps_its_parameters_and_shards() -> None:
    manifest = parse_manifest({**base(), "learners": 2, "framework": {"name": "easgd", "tau": 8}, "ps_shards": 2})
    resolved = manifest.resolved()
    assert resolved["framework"] == {"name": "easgd", "alpha": 0.1, "tau": 8, "timeout_s": 30.0, "topology": {
        "worker_groups": 2, "workers_per_group": 1, "server_groups": 1, "shards_per_group": 2, "colocated": False,
        "serves": [[0, 1]], "sync_period": None}}
    assert manifest.shards == 2
    assert parse_manifest(resolved).framework == manifest.framework
    assert parse_manifest({**base(), "learners": 2, "framework": {"name": "downpour"}}).shards == 1
    assert parse_manifest({**base(), "learners": 2, "framework": {"name": "allreduce"}}).shards == 0
    assert parse_manifest({**base(), "learners": 4, "framework": {"name": "downpour", "group_size": 2}}).shards == 1


def test_yaml_syntax_and_top_level_errors() -> None:
    with pytest.raises(ConfigError, match="invalid YAML: line 2"):
        load_manifest("name: a\n  bad: indent\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level, got list"):
        load_manifest("- name: a\n- b\n")
    with pytest.raises(ConfigError, match=r"cannot read .*absent\.job\.yml"):
        load_manifest("absent.job.yml")


@pytest.mark.parametrize("store", ["results_store", "data_store"])
@pytest.mark.parametrize("key", ["aws_secret_access_key", "aws_access_key_id", "aws_session_token", "password"])
def test_credentials_are_refused_and_never_echoed(store: str, key: str) -> None:
    spec = {"name": "s3", "bucket": "results", key: SECRET}
    error = errors_of(_set(base(), store, spec))
    assert [path for path, _ in error.errors] == [f"{store}.{key}"]
    assert "credentials never go in a manifest" in str(error)
    chain: BaseException | None = error
    while chain is not None:  # nor in the errors it was raised from
        assert SECRET not in str(chain) and SECRET not in repr(getattr(chain, "errors", ""))
        chain = chain.__cause__ or chain.__context__


def test_credentials_in_an_endpoint_url_are_refused_and_never_echoed() -> None:
    error = errors_of(_set(base(), "results_store",
                           {"name": "s3", "bucket": "results", "endpoint": f"https://AKIA:{SECRET}@s3.example.org"}))
    assert [path for path, _ in error.errors] == ["results_store.endpoint"]
    assert SECRET not in str(error)


def test_dumps_hold_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-ENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = AKIA-FILE\naws_secret_access_key = {SECRET}\n")
    data = _set(base(), "results_store", {"name": "s3", "endpoint": "http://127.0.0.1:9000", "bucket": "results",
                                          "prefix": "lab", "credentials_file": str(creds)})
    data["experiment"] = inline_experiment()
    manifest = parse_manifest(data)
    dumps = [json.dumps(manifest.resolved()), manifest.model_dump_json(), repr(manifest)]
    for text in dumps:
        assert SECRET not in text and "AKIA-" not in text
    assert manifest.resolved()["results_store"]["credentials_file"] == str(creds)  # where, not what


def test_training_overrides_merge_over_the_experiment() -> None:
    manifest = parse_manifest({**base(), "experiment": inline_experiment(), "training": {"epochs": 2}})
    assert manifest.training == {"epochs": 2}  # only what was given
    merged = manifest.training_config()
    assert (merged.epochs, merged.learning_rate) == (2, 0.01)


def test_a_registered_experiment_is_passed_in_to_merge() -> None:
    experiment = load_experiment(REPO / "examples" / "music_speech_noise.yml")
    manifest = parse_manifest({**base(), "training": {"learning_rate": 0.1}})
    with pytest.raises(ConfigError, match="is registered: pass its config"):
        manifest.training_config()
    merged = manifest.training_config(experiment)
    assert (merged.learning_rate, merged.epochs) == (0.1, experiment.training.epochs)
    other = experiment.model_copy(update={"name": "other"})
    with pytest.raises(ConfigError, match="trains 'music_speech_noise', not 'other'"):
        manifest.training_config(other)


def test_resolved_inlines_everything_and_loads_back() -> None:
    manifest = parse_manifest({**base(), "experiment": inline_experiment(), "training": {"epochs": 2}})
    resolved = manifest.resolved()
    assert resolved["experiment"]["name"] == "tones"
    assert resolved["training"]["epochs"] == 2 and resolved["training"]["learning_rate"] == 0.01
    assert resolved["training"]["schedule"] == {"name": "cosine", "eta_min": 0.0}  # the default, now explicit
    again = parse_manifest(json.loads(json.dumps(resolved)))
    assert again.resolved() == resolved
    assert again.training_config() == manifest.training_config()


def test_relative_paths_are_relative_to_the_manifest_file(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    folder.mkdir()
    data = {**base(), "experiment": inline_experiment(),
            "data_store": {"name": "s3", "bucket": "data", "credentials_file": "secrets/creds.ini"}}
    (folder / "j.job.yml").write_text(yaml.safe_dump(data))
    manifest = load_manifest(folder / "j.job.yml")
    assert manifest.results_store.path == folder / "out"
    assert manifest.data_store.credentials_file == folder / "secrets" / "creds.ini"
    assert manifest.experiment.dataset.root == folder / "data"
    assert manifest.experiment.store.root == folder / "store"
    assert load_manifest(str(folder / "j.job.yml")) == manifest  # a one-line string ending in .yml is a path


def test_command_framework_forms() -> None:
    as_list = parse_manifest(_set(base(), "framework", {"name": "command", "command": ["python", "train.py"],
                                                        "metrics": {"jsonl": "out/metrics.jsonl"}}))
    assert isinstance(as_list.framework, CommandFramework)
    assert as_list.framework.command == ["python", "train.py"]
    assert as_list.framework.metrics.jsonl == "out/metrics.jsonl"
    as_line = parse_manifest(_set(base(), "framework", {"name": "command", "command": "cd src && python train.py",
                                                        "metrics": {"regex": {"loss": r"loss=(?P<value>\S+)",
                                                                              "acc": r"acc (\d+\.\d+)"}}}))
    assert as_line.framework.command == ["sh", "-c", "cd src && python train.py"]
    assert set(as_line.framework.metrics.regex) == {"loss", "acc"}


def test_restart_backoff_doubles_up_to_its_cap() -> None:
    restart = parse_manifest(_set(base(), "restart", {"backoff_s": 2, "backoff_max_s": 10,
                                                      "user_exit_codes": [3, 1, 3]})).restart
    assert [restart.backoff(n) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]
    assert restart.user_exit_codes == [1, 3]


def test_manifests_are_frozen() -> None:
    manifest = parse_manifest(base())
    with pytest.raises(ValueError, match="frozen"):
        manifest.priority = 5  # type: ignore[misc]
    assert isinstance(manifest, JobManifest)


def test_the_example_manifest_trains_the_shipped_experiment() -> None:
    manifest = load_manifest(EXAMPLE)
    experiment = load_experiment(REPO / "examples" / "music_speech_noise.yml")
    assert manifest.experiment == experiment.name
    assert manifest.results_store.name == "local"
    assert manifest.results_store.path.is_absolute()
    training = manifest.training_config(experiment)
    assert training.epochs == manifest.training["epochs"]
    assert json.loads(json.dumps(manifest.resolved(experiment)))["experiment"]["model"]["name"] == "cnn"
