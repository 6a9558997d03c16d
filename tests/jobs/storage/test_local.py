"""The ``local`` storage: atomic writes, temporary files, folders, and the reachability check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import missing

import labswarm.storage.local as local_module
from labswarm.errors import StorageError
from labswarm.storage import LocalStorage, Storage

ROOT = Path(__file__).resolve().parents[3]


def make(root: Path, **params: object) -> LocalStorage:
    storage = Storage.from_spec({"name": "local", "path": str(root), **params})
    assert isinstance(storage, LocalStorage)
    return storage


def test_nothing_is_created_before_the_first_write(tmp_path: Path) -> None:
    storage = make(tmp_path / "results", prefix="jobs")
    storage.reachable()
    assert storage.list() == []
    assert not storage.exists("x")
    assert not (tmp_path / "results").exists()
    storage.put_bytes("a/b", b"1")
    assert (tmp_path / "results" / "jobs" / "a" / "b").read_bytes() == b"1"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make(tmp_path)
    storage.put_bytes("ckpt/last.pt", b"old")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local_module.os, "replace", refuse)
    with pytest.raises(StorageError, match=r"cannot write .*ckpt/last.pt: No space left on device"):
        storage.put_bytes("ckpt/last.pt", b"new")
    source = tmp_path / "src.bin"
    source.write_bytes(b"new file")
    with pytest.raises(StorageError, match="No space left"):
        storage.put_file("ckpt/last.pt", source)
    monkeypatch.undo()
    assert storage.get_bytes("ckpt/last.pt") == b"old"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.pt"]


def test_temporary_files_of_killed_writers_are_never_listed(tmp_path: Path) -> None:
    storage = make(tmp_path)
    storage.put_bytes("logs/a.log", b"1")
    (tmp_path / "logs" / ".b.log.0123456789ab.tmp").write_bytes(b"partial")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x").write_bytes(b"")
    assert storage.list() == ["logs/a.log"]
    with pytest.raises(StorageError, match="invalid key"):
        storage.get_bytes("logs/.b.log.0123456789ab.tmp")


def test_delete_removes_the_folders_it_empties_but_not_the_root(tmp_path: Path) -> None:
    root = tmp_path / "results"
    storage = make(root)
    storage.put_bytes("jobs/j1/ckpt/e1.pt", b"1")
    storage.put_bytes("jobs/j2/model.pt", b"2")
    assert storage.at("jobs/j1").delete() == 1
    assert not (root / "jobs" / "j1").exists()
    assert (root / "jobs" / "j2" / "model.pt").is_file()
    assert storage.delete() == 1
    assert root.is_dir() and list(root.iterdir()) == []


def test_an_object_cannot_replace_a_folder_of_objects(tmp_path: Path) -> None:
    storage = make(tmp_path)
    storage.put_bytes("a/b", b"1")
    with pytest.raises(StorageError, match="folder"):
        storage.put_bytes("a", b"2")
    with pytest.raises(StorageError):
        storage.put_bytes("a/b/c", b"3")  # "a/b" is a file
    assert storage.get_bytes("a/b") == b"1"


def test_reachable_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="is not a folder"):
        make(tmp_path / "file" / "results").reachable()
    with pytest.raises(StorageError, match="is not a folder"):
        make(tmp_path / "file").reachable()


#: The check of a read-only folder, in a child process: prints the refusal, exits non-zero if there is none.
READ_ONLY_CHECK = """
import os
import sys

from labswarm.errors import StorageError
from labswarm.storage import Storage

try:
    Storage.from_spec({"name": "local", "path": sys.argv[1]}).reachable()
except StorageError as exc:
    print(exc)
else:
    sys.exit(f"reachable() accepted {sys.argv[1]} (os.access W_OK of its parent: {os.access(sys.argv[2], 2)})")
"""


def test_reachable_refuses_a_read_only_folder(tmp_path: Path) -> None:
    """Root writes anywhere (CAP_DAC_OVERRIDE), and CI runs as root: there the check runs as root still, in a child
    whose capability bounding set lacks DAC_OVERRIDE and DAC_READ_SEARCH (``setpriv``), so the folder's mode bits
    bind it as they bind any other user."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if drop and shutil.which("setpriv") is None:
        missing("running as root, and setpriv (util-linux) is not there to drop CAP_DAC_OVERRIDE")
    try:
        result = subprocess.run([*drop, sys.executable, "-c", READ_ONLY_CHECK,
                                 str(folder / "results"), str(folder)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(0o700)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{folder / 'results'}: the nearest existing parent {folder} is not writable" in result.stdout, result.stdout


def test_fsync_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(local_module.os, "fsync", calls.append)
    make(tmp_path, fsync=False).put_bytes("a", b"1")
    assert calls == []
    make(tmp_path).put_bytes("b", b"1")
    assert len(calls) == 1
