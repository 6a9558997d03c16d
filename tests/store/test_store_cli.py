"""``labswarm store du/ls/verify/gc/pull`` against a real manager (embedded, over HTTP) whose registered
experiments share a local store, and a remote store on the test S3 server for ``pull``."""

from __future__ import annotations

import json
import mmap
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import experiment_dict, write_dataset
from jobs.conftest import S3Endpoint
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig
from labswarm.local import run_local
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.settings import Settings
from labswarm.store import FeatureStore
from labswarm.store.written import ENV

TOKEN = "store-cli-token"
ORPHANS = ["0" * 39 + str(i) for i in range(3)]


def compute(config: ExperimentConfig) -> set[str]:
    """Compute every feature of ``config`` into its store; the keys."""
    block, keys = FeaturesBlock(config), set()
    for sample in iter_samples(config):
        assert block.process(sample).status in ("computed", "cached")
        keys |= set(block.keys(sample).values())
    return keys


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("LABSWARM_API_TOKEN", TOKEN)
    monkeypatch.delenv("LABSWARM_MANAGER_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, set[str]]]]:
    """A manager with two experiments registered on one store (``tones`` and ``coarse``, which shares its
    un-augmented clips' mel arrays... of another size, so none) and a third on another store, all computed,
    plus :data:`ORPHANS` in the shared store; ``(url, store folder, keys by experiment)``."""
    dataset = write_dataset(tmp_path / "data", n_per_label=2)
    store = tmp_path / "store"
    specs = {"tones": experiment_dict(dataset, store),
             "coarse": experiment_dict(dataset, store, name="coarse", features=[{"name": "mel", "n_mels": 16}]),
             "elsewhere": experiment_dict(dataset, tmp_path / "other", name="elsewhere")}
    keys = {name: compute(ExperimentConfig.model_validate(spec)) for name, spec in specs.items()}
    for key in ORPHANS:
        FeatureStore(store).put(key, np.ones((4, 4), np.float32))
    with EmbeddedServer(create_app(Settings(home=tmp_path / "home", api_token=TOKEN))) as server, \
            ManagerClient(server.url, TOKEN) as client:
        for spec in specs.values():
            client.post_experiment(spec)
        yield server.url, store, keys


def test_du_counts_per_experiment_and_feature(runner: CliRunner, shared) -> None:
    url, store, keys = shared
    result = runner.invoke(app, ["store", "du", "--store", str(store), "--manager", url, "--json"])
    assert result.exit_code == 0, result.output
    usage = {(r["experiment"], r["feature"]): r for r in json.loads(result.output)["usage"]}
    assert set(usage) == {("tones", "mel"), ("tones", "mfcc"), ("coarse", "mel"), ("(none)", "-")}
    assert usage[("tones", "mel")]["arrays"] == usage[("tones", "mel")]["referenced"] == 8
    assert usage[("coarse", "mel")]["arrays"] == 8 and usage[("(none)", "-")]["arrays"] == len(ORPHANS)
    sizes = FeatureStore(store).sizes()
    assert usage[("tones", "mfcc")]["bytes"] == sum(sizes[k] for k in keys["tones"] if k not in keys["coarse"]) \
        - usage[("tones", "mel")]["bytes"]
    table = runner.invoke(app, ["store", "du", "--store", str(store), "--manager", url])
    assert table.exit_code == 0 and "coarse" in table.output and "(none)" in table.output


def test_gc_never_removes_an_array_of_a_registered_experiment(runner: CliRunner, shared) -> None:
    url, store, keys = shared
    before = set(FeatureStore(store).sizes())
    dry = runner.invoke(app, ["store", "gc", "--store", str(store), "--manager", url, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["arrays"] == len(ORPHANS) and set(FeatureStore(store).sizes()) == before
    assert json.loads(dry.output)["experiments"] == ["coarse", "tones"]  # not "elsewhere": another store
    done = runner.invoke(app, ["store", "gc", "--store", str(store), "--manager", url])
    assert done.exit_code == 0, done.output
    assert "removed 3 arrays" in done.output
    assert set(FeatureStore(store).sizes()) == keys["tones"] | keys["coarse"] == before - set(ORPHANS)
    other = FeatureStore(store.parent / "other").sizes()
    assert set(other) == keys["elsewhere"]  # another store: untouched


def test_gc_refuses_when_an_experiments_keys_cannot_be_derived(runner: CliRunner, shared) -> None:
    url, store, _keys = shared
    next((store.parent / "data").rglob("*.wav")).unlink()  # a clip unreadable: its arrays are unknown
    before = set(FeatureStore(store).sizes())
    result = runner.invoke(app, ["store", "gc", "--store", str(store), "--manager", url])
    assert result.exit_code == 2, result.output
    assert "cannot tell which arrays it references" in result.output
    assert set(FeatureStore(store).sizes()) == before


def test_gc_refuses_without_a_manager(runner: CliRunner, shared) -> None:
    _url, store, _keys = shared
    result = runner.invoke(app, ["store", "gc", "--store", str(store), "--manager", "http://127.0.0.1:9"])
    assert result.exit_code == 3, result.output
    assert len(FeatureStore(store).sizes()) == 16 + 8 + len(ORPHANS)


def test_ls_and_verify(runner: CliRunner, shared) -> None:
    url, store, keys = shared
    listed = runner.invoke(app, ["store", "ls", "--store", str(store), "--json"])
    assert listed.exit_code == 0 and len(json.loads(listed.output)) == 16 + 8 + len(ORPHANS)
    one = runner.invoke(app, ["store", "ls", "-e", "tones", "--manager", url, "--json", "--limit", "4"])
    assert one.exit_code == 0, one.output
    rows = json.loads(one.output)
    assert len(rows) == 4 and {r["feature"] for r in rows} == {"mel", "mfcc"} and all(r["bytes"] for r in rows)
    assert runner.invoke(app, ["store", "verify", "--store", str(store)]).exit_code == 0
    bad = sorted(keys["coarse"])[0]
    path = store / FeatureStore.relpath(bad)
    path.write_bytes(path.read_bytes()[:-4])
    result = runner.invoke(app, ["store", "verify", "--store", str(store), "--json"])
    assert result.exit_code == 1 and list(json.loads(result.output)["problems"]) == [bad]
    assert runner.invoke(app, ["store", "du", "--manager", url]).exit_code == 2  # no store named


@pytest.mark.parametrize("layout", ["keys", "packs"])
def test_pull_warms_the_cache_of_a_remote_store(runner: CliRunner, tmp_path: Path, s3_endpoint: S3Endpoint,
                                                monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """In both write layouts of a remote store: an object per array, and the workers' written packs (one a
    message: labswarm/store/written.py), pulled whole."""
    monkeypatch.setenv(ENV, "1" if layout == "packs" else "0")  # the forked workers inherit it
    dataset = write_dataset(tmp_path / "data", n_per_label=2)
    spec = experiment_dict(dataset, tmp_path / "cache")
    spec["store"]["remote"] = s3_endpoint.spec(prefix="features")
    config = ExperimentConfig.model_validate(spec)
    summary = run_local(config, jobs=2)  # two forked worker processes write to the bucket, and only there
    assert summary.computed == 8 and summary.failed == 0, summary
    keys = compute(config)  # all cached now: their keys
    assert not list((tmp_path / "cache").rglob("*.npy"))
    arrays = [k for k in s3_endpoint.objects() if k.endswith(".npy")]
    written = [k for k in s3_endpoint.objects() if k.startswith("features/written/v1/") and k.endswith(".pack")]
    assert len(keys) == 16 and (len(arrays), bool(written)) == ((16, False) if layout == "keys" else (0, True))
    assert len(written) <= 8  # the packs layout: a pack a message (of one or more samples), none a key
    path = tmp_path / "tones.yml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["store", "pull", str(path)])
    assert result.exit_code == 0, result.output
    assert "pulled 16 arrays" in result.output
    cached = {p.stem for p in (tmp_path / "cache" / "objects").rglob("*.npy")}
    assert cached == (keys if layout == "keys" else set())
    assert len(list((tmp_path / "cache" / "objects").rglob("*.pack"))) == len(written)
    store = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix="features"))
    assert isinstance(store.get(sorted(keys)[0], mmap=True).base, mmap.mmap)  # a learner maps the cached file
    again = runner.invoke(app, ["store", "pull", str(path)])
    assert again.exit_code == 0 and "pulled 0 arrays, 16 were cached" in again.output
    packed = runner.invoke(app, ["store", "pack", str(path)])  # then a cold cache is pulled one pack at a time
    assert packed.exit_code == 0 and "wrote 1 packs of 16 arrays" in packed.output, packed.output
    shutil.rmtree(tmp_path / "cache" / "objects")
    (tmp_path / "cache" / ".usage.json").unlink()
    result = runner.invoke(app, ["store", "pull", str(path)])
    assert result.exit_code == 0 and "pulled 16 arrays" in result.output, result.output
    assert not list((tmp_path / "cache").rglob("*.npy")) and len(list((tmp_path / "cache").rglob("*.pack"))) == 1
    if layout == "packs":  # a cache smaller than a written pack: computed arrays not cached, not 'not computed'
        small = {**spec, "store": {**spec["store"], "root": str(tmp_path / "small"), "cache_bytes": 1}}
        path.with_name("small.yml").write_text(yaml.safe_dump(small))
        result = runner.invoke(app, ["store", "pull", str(path.with_name("small.yml"))])
        assert result.exit_code == 0 and "pulled 0 arrays" in result.output, result.output
        assert "0 not computed yet, 16 not cached" in result.output, result.output
    path.with_name("local.yml").write_text(yaml.safe_dump(experiment_dict(dataset, tmp_path / "store")))
    local = runner.invoke(app, ["store", "pull", str(path.with_name("local.yml"))])
    assert local.exit_code == 2 and "nothing to pull" in local.output
    local = runner.invoke(app, ["store", "pack", str(path.with_name("local.yml"))])
    assert local.exit_code == 2 and "packs serve the caches of a remote store" in local.output


def test_gc_refuses_a_users_token(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's token lists only that user's experiments: gc with it would collect the others' arrays."""
    from labswarm.auth.tokens import add_token

    dataset = write_dataset(tmp_path / "data", n_per_label=2)
    store = tmp_path / "store"
    spec = experiment_dict(dataset, store)
    keys = compute(ExperimentConfig.model_validate(spec))
    tokens = tmp_path / "tokens.yml"
    alice = add_token(tokens, "alice")
    settings = Settings(home=tmp_path / "home", api_token=TOKEN, tokens_file=tokens)
    with EmbeddedServer(create_app(settings)) as server, ManagerClient(server.url, TOKEN) as admin:
        admin.post_experiment(spec)  # the admin's experiment: alice does not see it
        with ManagerClient(server.url, alice) as client:
            assert client.whoami() == {"name": "alice", "role": "user"}
        assert admin.whoami()["role"] == "admin"
        monkeypatch.setenv("LABSWARM_API_TOKEN", alice)
        result = runner.invoke(app, ["store", "gc", "--store", str(store), "--manager", server.url])
    assert result.exit_code == 2, result.output
    assert "alice is not an admin" in result.output
    assert set(FeatureStore(store).sizes()) == keys
