"""Data roots (labswarm.paths): a configuration posted to the manager names no path outside them, and no error
message quotes a file's content. Real manager over real HTTP (uvicorn in a thread), real files and symlinks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from helpers import experiment_dict, write_dataset, write_tone

from labswarm.config.experiment import load_experiment, parse_experiment
from labswarm.config.manifest import parse_manifest
from labswarm.config.roots import check_experiment_paths, check_labels_paths, check_manifest_paths, experiment_folders
from labswarm.errors import ConfigError, DatasetError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.paths import LIST_FOLDER_AFTER, OUTSIDE, DataRoots
from labswarm.settings import Settings

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The one data root: a dataset and a noise file inside."""
    write_dataset(tmp_path / "root" / "data")
    write_tone(tmp_path / "root" / "noise.wav")
    return tmp_path / "root"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the root, with a dataset and a noise file of its own."""
    write_dataset(tmp_path / "outside" / "data")
    write_tone(tmp_path / "outside" / "noise.wav")
    return tmp_path / "outside"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[list[Path]], httpx.Client]]:
    """``serve(roots)``: an httpx client of a fresh manager whose data roots are ``roots``."""
    servers: list[EmbeddedServer] = []
    clients: list[httpx.Client] = []

    def start(roots: list[Path]) -> httpx.Client:
        settings = Settings(home=tmp_path / f"home{len(servers)}", data_roots=roots)
        servers.append(EmbeddedServer(create_app(settings)).start())
        clients.append(httpx.Client(base_url=servers[-1].url, timeout=10.0))
        return clients[-1]

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


def _experiment(root: Path, **overrides) -> dict:
    data = experiment_dict(root / "data", root / "store", name="bounded")
    data["transformations"] = [{"name": "identity"},
                               {"name": "add_noise", "snr_db": 10, "file": str(root / "noise.wav")}]
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
    return data


def _refused(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {error["path"]: error["reason"] for error in response.json()["detail"]}


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "labels", "noise", "store"])
def test_a_path_outside_the_roots_is_refused_naming_its_field_and_nothing_is_created(
        case: str, root: Path, outside: Path, serve) -> None:
    (root / "link").symlink_to(outside / "data", target_is_directory=True)
    overrides, fields = {
        "dotdot": ({"dataset.root": str(root / ".." / "outside" / "data")}, {"dataset.root", "dataset.labels"}),
        "absolute": ({"dataset.root": str(outside / "data")}, {"dataset.root", "dataset.labels"}),
        "symlink": ({"dataset.root": str(root / "link")}, {"dataset.root", "dataset.labels"}),
        "labels": ({"dataset.labels": str(outside / "data" / "labels.csv")}, {"dataset.labels"}),
        "noise": ({"transformations.1.file": str(outside / "noise.wav")}, {"transformations.1.file"}),
        "store": ({"store.root": str(outside / "store")}, {"store.root"}),
    }[case]
    http = serve([root])
    errors = _refused(http.post("/experiments", json=_experiment(root, **overrides)))
    assert set(errors) == fields, errors
    assert all(OUTSIDE in reason for reason in errors.values()), errors
    assert http.get("/experiments").json() == []
    assert not (root / "store").exists() and not (outside / "store").exists()  # nothing created


def test_paths_inside_the_roots_are_accepted(root: Path, serve) -> None:
    (root / "alias").symlink_to(root / "data", target_is_directory=True)  # a symlink that stays inside
    http = serve([root])
    for data in (_experiment(root), _experiment(root, **{"dataset.root": str(root / "alias")})):
        response = http.post("/experiments", json=data)
        assert response.status_code == 201, response.text
    assert [e["name"] for e in http.get("/experiments").json()] == ["bounded"]


def test_relative_paths_resolve_against_the_current_directory(root: Path, monkeypatch) -> None:
    monkeypatch.chdir(root)
    config = parse_experiment(_experiment(root, **{"dataset.root": "data", "store.root": "store"}))
    check_experiment_paths(config, DataRoots())  # the default root: the current directory
    escaping = parse_experiment(_experiment(root, **{"dataset.root": "../outside", "store.root": "store"}))
    with pytest.raises(ConfigError) as caught:
        check_experiment_paths(escaping, DataRoots())
    assert [path for path, _ in caught.value.errors] == ["dataset.root", "dataset.labels"]


def test_a_file_outside_the_roots_is_never_read_and_a_labels_file_is_never_quoted(root: Path, serve) -> None:
    http = serve([root])
    errors = _refused(http.post("/experiments", json=_experiment(root, **{"dataset.labels": "/etc/passwd"})))
    assert list(errors) == ["dataset.labels"] and "root:x:" not in str(errors)
    # a manager whose root is / reads it (its rows are checked): the error says what is wrong, not what it read
    http = serve([Path("/")])
    response = http.post("/experiments", json=_experiment(root, **{"dataset.labels": "/etc/passwd"}))
    assert response.status_code == 422, response.text
    assert "missing column(s) path, label" in response.text and "root:x:" not in response.text, response.text


def _labels(root: Path, *paths: str) -> None:
    """Append rows naming ``paths`` to the dataset's labels CSV."""
    with (root / "data" / "labels.csv").open("a") as handle:
        handle.writelines(f"{path},low,s3cr3t-{i}\n" for i, path in enumerate(paths))


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "symlinked_folder"])
def test_a_labels_row_outside_the_roots_is_refused_by_line_without_quoting_it(
        case: str, root: Path, outside: Path, serve) -> None:
    (root / "data" / "low" / "link.wav").symlink_to(outside / "data" / "low" / "low_0.wav")
    (root / "data" / "away").symlink_to(outside / "data" / "high", target_is_directory=True)
    row = {"dotdot": "../../outside/data/low/low_0.wav", "absolute": str(outside / "data" / "low" / "low_0.wav"),
           "symlink": "low/link.wav", "symlinked_folder": "away/high_0.wav"}[case]
    _labels(root, row)  # line 6: header + 4 rows before it
    http = serve([root])
    response = http.post("/experiments", json=_experiment(root))
    errors = _refused(response)
    assert list(errors) == ["dataset.labels"] and errors["dataset.labels"].startswith("line 6 (column path): "
                                                                                      + OUTSIDE), errors
    assert "s3cr3t" not in response.text and "outside/data" not in response.text, response.text  # not quoted
    assert http.get("/experiments").json() == [] and not (root / "store").exists()


def test_rows_inside_the_roots_are_accepted_and_many_outside_are_counted(root: Path, outside: Path,
                                                                           serve) -> None:
    (root / "data" / "low" / "alias.wav").symlink_to(root / "data" / "low" / "low_0.wav")  # stays inside
    _labels(root, "low/alias.wav", str(root / "data" / "high" / "high_1.wav"), "low/../low/low_1.wav")
    http = serve([root])
    assert http.post("/experiments", json=_experiment(root)).status_code == 201
    _labels(root, *(str(outside / "data" / "low" / f"x{i}.wav") for i in range(15)))
    data = _experiment(root)
    data["name"] = "many"
    response = http.post("/experiments", json=data)
    assert response.status_code == 422, response.text
    reasons = [error["reason"] for error in response.json()["detail"]]
    assert [r.split(" (")[0] for r in reasons[:10]] == [f"line {n}" for n in range(9, 19)], reasons
    assert reasons[10] == f"and 5 more row(s) {OUTSIDE}", reasons


def test_a_labels_row_added_after_registration_is_refused_when_a_session_starts(root: Path, outside: Path,
                                                                                  serve) -> None:
    http = serve([root])
    assert http.post("/experiments", json=_experiment(root)).status_code == 201
    _labels(root, str(outside / "data" / "low" / "low_0.wav"))
    errors = _refused(http.post("/experiments/bounded/sessions", json={}))
    assert list(errors) == ["dataset.labels"] and OUTSIDE in errors["dataset.labels"], errors
    assert http.get("/sessions").json() == []  # no session was created


def test_the_dataset_readers_check_rows_given_roots(root: Path, outside: Path) -> None:
    from labswarm.datasets.folder import iter_clips, read_clips
    from labswarm.paths import OutsideDataRoots

    _labels(root, "../../outside/data/low/low_0.wav")
    labels = root / "data" / "labels.csv"
    assert len(read_clips(root / "data", labels)) == 5  # no roots: not checked
    assert len(read_clips(root / "data", labels, DataRoots([root, outside]))) == 5
    clips = iter_clips(root / "data", labels, DataRoots([root]))
    assert len([next(clips) for _ in range(4)]) == 4  # the rows before it are handed out
    with pytest.raises(OutsideDataRoots) as caught:
        next(clips)
    assert isinstance(caught.value, DatasetError) and isinstance(caught.value, ConfigError)
    assert caught.value.errors[0][0] == "dataset.labels" and "line 6" in caught.value.errors[0][1]


@pytest.mark.parametrize("content", [
    b"root:x:0:0:s3cr3t:/root:/bin/bash\n",  # no path and label columns: the header is not quoted
    b"path,label\ns3cr3t-a.wav,x\ns3cr3t-a.wav,y\n",  # a path listed twice: the path is not quoted
    b"path,label\n\xff\xfes3cr3t\n",  # not UTF-8: the bytes are not quoted
    b"path,label\n\"s3cr3t\x00,x\n",  # not CSV
])
def test_labels_csv_errors_quote_nothing_of_the_file(tmp_path: Path, content: bytes) -> None:
    from labswarm.datasets.folder import read_clips

    (tmp_path / "labels.csv").write_bytes(content)
    with pytest.raises(DatasetError) as caught:
        read_clips(tmp_path, tmp_path / "labels.csv")
    message = str(caught.value)
    assert "labels.csv" in message and "line" in message, message
    assert "root:x" not in message and "s3cr3t" not in message and "\\x" not in message, message


def test_yaml_errors_quote_no_text_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "experiment.yml"
    path.write_text("name: x\nkey: *secretalias\n")
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    assert "line 2" in str(caught.value) and "secretalias" not in str(caught.value)
    path.write_bytes(b"name: \xff\xfes3cr3t\n")
    with pytest.raises(ConfigError, match="not UTF-8") as caught:
        load_experiment(path)
    assert "secret" not in str(caught.value) and "\\x" not in str(caught.value)


def test_manifest_paths(root: Path, outside: Path) -> None:
    inline = {**_experiment(root, **{"store.root": str(outside / "store")}),
              "model": {"name": "cnn", "input": "mel"}, "training": {"epochs": 1}}
    manifest = parse_manifest({"name": "job", "experiment": inline,
                               "data_store": {"name": "local", "path": str(root / "in")},
                               "results_store": {"name": "local", "path": str(outside / "results")}})
    with pytest.raises(ConfigError) as caught:
        check_manifest_paths(manifest, DataRoots([root]))
    assert [path for path, _ in caught.value.errors] == ["experiment.store.root", "results_store.path"]
    check_manifest_paths(manifest, DataRoots([root, outside]))


def test_settings_read_a_path_list_or_json(monkeypatch) -> None:
    monkeypatch.setenv("LABSWARM_DATA_ROOTS", f"/data{os.pathsep}/srv/audio")
    assert Settings().data_roots == [Path("/data"), Path("/srv/audio")]
    monkeypatch.setenv("LABSWARM_DATA_ROOTS", '["/data", "/a:b"]')
    assert Settings().data_roots == [Path("/data"), Path("/a:b")]
    monkeypatch.delenv("LABSWARM_DATA_ROOTS")
    assert Settings().data_roots == [] and DataRoots.from_settings(Settings()).roots == (Path.cwd().resolve(),)


def test_the_readme_example_is_in_its_own_roots_from_any_directory(tmp_path: Path, monkeypatch) -> None:
    """``labswarm run examples/music_speech_noise.yml`` gives its embedded manager the folders the file names."""
    monkeypatch.chdir(tmp_path)
    config = load_experiment(REPO / "examples" / "music_speech_noise.yml")
    with pytest.raises(ConfigError):
        check_experiment_paths(config, DataRoots())  # tmp_path: the data/ beside examples/ is outside
    check_experiment_paths(config, DataRoots(experiment_folders(config)))


def test_a_job_naming_a_path_outside_the_roots_is_refused_before_anything_is_opened(root: Path, outside: Path,
                                                                                      serve) -> None:
    inline = {**_experiment(root, **{"dataset.labels": "/etc/passwd"}),
              "model": {"name": "cnn", "input": "mel"}, "training": {"epochs": 1}}
    manifest = {"name": "job", "experiment": inline,
                "results_store": {"name": "local", "path": str(outside / "results")}}
    http = serve([root])
    for route in ("/v1/jobs/validate", "/v1/jobs"):
        errors = _refused(http.post(route, json=manifest))
        assert set(errors) == {"experiment.dataset.labels", "results_store.path"}, errors
        assert all(OUTSIDE in reason for reason in errors.values()) and "root:x:" not in str(errors), errors
    assert not (outside / "results").exists() and http.get("/experiments").json() == []
    manifest["experiment"] = _experiment(root) | {"model": {"name": "cnn", "input": "mel"}, "training": {"epochs": 1}}
    manifest["results_store"]["path"] = str(root / "results")
    assert http.post("/v1/jobs/validate", json=manifest).status_code == 200
    _labels(root, str(outside / "data" / "low" / "low_0.wav"))  # an inline experiment's rows are checked too
    errors = _refused(http.post("/v1/jobs/validate", json=manifest))
    assert list(errors) == ["experiment.dataset.labels"] and "line 6" in errors["experiment.dataset.labels"], errors


def test_symlinks_are_found_in_a_folder_listed_once_many_of_its_files_are_rows(root: Path, outside: Path) -> None:
    """Past LIST_FOLDER_AFTER rows in one folder, the check lists the folder instead of one lstat per row: a
    symlink out of the roots among them is still refused by its line, one that stays inside still accepted, and
    the rows are counted."""
    folder = root / "data" / "many"
    folder.mkdir()
    n = LIST_FOLDER_AFTER + 20
    for i in range(n):
        (folder / f"f{i}.wav").touch()
    (folder / "in.wav").symlink_to(folder / "f0.wav")
    (folder / "out.wav").symlink_to(outside / "data" / "low" / "low_0.wav")
    config = parse_experiment(_experiment(root))
    before = check_labels_paths(config, DataRoots([root]))  # the 4 rows of the tone set
    _labels(root, *(f"many/f{i}.wav" for i in range(n)), "many/in.wav", "many/./f1.wav", "many//f2.wav")
    assert check_labels_paths(config, DataRoots([root])) == before + n + 3
    _labels(root, "many/out.wav")
    with pytest.raises(ConfigError) as refused:
        check_labels_paths(config, DataRoots([root]))
    assert refused.value.errors == [("dataset.labels", f"line {before + n + 5} (column path): {OUTSIDE} ({root})")]
