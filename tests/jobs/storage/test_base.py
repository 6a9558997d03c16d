"""The storage contract: one body per behaviour, run against every backend (``local`` and ``s3``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labswarm.errors import ConfigError, LabswarmError, StorageError
from labswarm.storage import MAX_KEY_BYTES, MissingObject, Storage

from .conftest import Backend


def test_bytes_round_trip_under_the_prefix(backend: Backend) -> None:
    storage = backend.make("jobs/j1")
    storage.put_bytes("checkpoints/epoch-1.pt", b"first")
    storage.put_bytes("checkpoints/epoch-1.pt", b"second, longer")  # replaces
    storage.put_bytes("model.pt", b"\x00\xff" * 10)
    assert storage.get_bytes("checkpoints/epoch-1.pt") == b"second, longer"
    assert storage.get_bytes("model.pt") == b"\x00\xff" * 10
    assert backend.raw_keys() == ["jobs/j1/checkpoints/epoch-1.pt", "jobs/j1/model.pt"]


def test_missing_object(backend: Backend, tmp_path: Path) -> None:
    storage = backend.make()
    with pytest.raises(MissingObject, match=r"nope/model\.pt"):
        storage.get_bytes("nope/model.pt")
    target = tmp_path / "out" / "model.pt"
    target.parent.mkdir()
    target.write_bytes(b"kept")
    with pytest.raises(MissingObject):
        storage.get_file("nope/model.pt", target)
    assert target.read_bytes() == b"kept"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.pt"]  # no temporary file left


def test_a_range_of_an_object(backend: Backend) -> None:
    storage = backend.make("p")
    storage.put_bytes("pack", bytes(range(100)))
    assert storage.get_range("pack", 10, 5) == bytes(range(10, 15))
    assert storage.get_range("pack", 95, 10) == bytes(range(95, 100))  # the object ends first: fewer bytes
    assert storage.get_range("pack", 0, 100) == bytes(range(100))
    with pytest.raises(MissingObject, match="nope"):
        storage.get_range("nope", 0, 1)
    with pytest.raises(StorageError, match="a byte or more"):
        storage.get_range("pack", 0, 0)
    with pytest.raises(StorageError, match="a byte or more"):
        storage.get_range("pack", -1, 5)


def test_a_conditional_delete_spares_an_object_written_since_it_was_listed(backend: Backend) -> None:
    storage = backend.make("p")
    storage.put_bytes("d/orphan", b"first write")
    listed = storage.modified("d")["d/orphan"]
    assert listed.size == len(b"first write") and listed.version
    storage.put_bytes("d/orphan", b"written again")  # by another writer, after the listing
    assert not storage.delete_if("d/orphan", listed.version)
    assert storage.get_bytes("d/orphan") == b"written again"
    assert storage.delete_if("d/orphan", storage.modified("d")["d/orphan"].version)
    assert not storage.exists("d/orphan") and not storage.delete_if("d/orphan", listed.version)  # gone: no error
    assert backend.raw_keys() == []  # nothing left aside


def test_file_round_trip(backend: Backend, tmp_path: Path) -> None:
    source = tmp_path / "checkpoint.bin"
    payload = bytes(range(256)) * 4099  # ~1 MB, not a multiple of any buffer size
    source.write_bytes(payload)
    storage = backend.make("results")
    storage.put_file("ckpt/a.bin", source)
    target = storage.get_file("ckpt/a.bin", tmp_path / "down" / "deep" / "a.bin")  # parents created
    assert target == tmp_path / "down" / "deep" / "a.bin"
    assert target.read_bytes() == payload
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.bin"]
    with pytest.raises(StorageError, match="not a file"):
        storage.put_file("ckpt/b.bin", tmp_path / "absent.bin")
    assert storage.list() == ["ckpt/a.bin"]


def test_exists(backend: Backend) -> None:
    storage = backend.make("p")
    storage.put_bytes("logs/learner-0.log", b"line\n")
    assert storage.exists("logs/learner-0.log")
    assert not storage.exists("logs/learner-1.log")
    assert not storage.exists("logs")  # a folder is not an object


def test_list_is_by_folder_sorted_and_relative(backend: Backend) -> None:
    storage = backend.make("p")
    for key in ("a/x", "a/b/y", "ab/z", "c"):
        storage.put_bytes(key, key.encode())
    backend.make("q").put_bytes("a/other", b"outside the prefix")
    assert storage.list() == ["a/b/y", "a/x", "ab/z", "c"]
    assert storage.list("a") == ["a/b/y", "a/x"]
    assert storage.list("a/") == ["a/b/y", "a/x"]
    assert storage.list("a/b") == ["a/b/y"]
    assert storage.list("missing") == []


def test_delete_an_object_and_a_folder(backend: Backend) -> None:
    storage = backend.make("p")
    for key in ("a/x", "a/b/y", "ab/z", "c"):
        storage.put_bytes(key, b"1")
    assert storage.delete("a") == 2
    assert storage.list() == ["ab/z", "c"]
    assert storage.delete("c") == 1
    assert storage.delete("c") == 0  # missing: no error
    assert storage.list() == ["ab/z"]
    assert backend.raw_keys() == ["p/ab/z"]


def test_views_share_the_backend_and_stay_inside_their_prefix(backend: Backend) -> None:
    results = backend.make("results")
    job = results.at("jobs/j1")
    other = results.at("jobs/j2")
    job.put_bytes("model.pt", b"m1")
    other.put_bytes("model.pt", b"m2")
    assert job.root == "results/jobs/j1"
    assert results.list() == ["jobs/j1/model.pt", "jobs/j2/model.pt"]
    assert job.list() == ["model.pt"]
    assert job.at("sub").root == "results/jobs/j1/sub"
    assert job.delete() == 1
    assert results.list() == ["jobs/j2/model.pt"]
    assert other.get_bytes("model.pt") == b"m2"


def test_delete_everything_spares_other_prefixes(backend: Backend) -> None:
    backend.make("p").put_bytes("x", b"1")
    backend.make("p2").put_bytes("x", b"2")
    assert backend.make("p").delete() == 1
    assert backend.raw_keys() == ["p2/x"]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "./a", "a/./b", "a//b", ".hidden", "a/.tmp",
                                 "a\\b", "a\x00b", "a\nb"])
def test_invalid_keys_are_refused_before_any_io(backend: Backend, key: str) -> None:
    storage = backend.make("p")
    with pytest.raises(StorageError, match="invalid key"):
        storage.put_bytes(key, b"x")
    with pytest.raises(StorageError, match="invalid key"):
        storage.get_bytes(key)
    with pytest.raises(StorageError, match="invalid key"):
        storage.exists(key)
    if key:  # "" is the whole view for list and delete
        with pytest.raises(StorageError, match="invalid key"):
            storage.list(key)
        with pytest.raises(StorageError, match="invalid key"):
            storage.delete(key)
        with pytest.raises(StorageError, match="invalid key"):
            storage.at(key)
    assert backend.raw_keys() == []


def test_too_long_keys_are_refused(backend: Backend) -> None:
    storage = backend.make("p")
    length = MAX_KEY_BYTES - len("p/")
    key = ("k" * 99 + "/") * (length // 100) + "k" * (length % 100)  # segments short enough for any filesystem
    assert len(key) == length
    storage.put_bytes(key, b"fits")  # exactly at the limit
    with pytest.raises(StorageError, match="longer than"):
        storage.put_bytes(key + "k", b"too long")


def test_reachable(backend: Backend) -> None:
    backend.make("p").reachable()
    assert backend.raw_keys() == []  # checked without writing


def test_errors_are_labswarm_errors(backend: Backend) -> None:
    assert issubclass(MissingObject, StorageError)
    assert issubclass(StorageError, LabswarmError)
    with pytest.raises(LabswarmError):
        backend.make().get_bytes("nothing")


def test_unknown_storage_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known: local, s3"):
        Storage.from_spec({"name": "ftp", "host": "x"})
    with pytest.raises(ConfigError, match="prefix"):
        Storage.from_spec({"name": "local", "path": "/tmp/x", "prefix": "../up"})
