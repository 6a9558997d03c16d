"""The ``local`` storage: atomic writes, temporary files, folders, and the reachability check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
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


def test_a_conditional_delete_checks_first_puts_back_without_links_syncs_and_gc_sweeps_leftovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LocalStorage.delete_if (review #3): a file written since it was listed is never taken aside (a reader would
    miss it meanwhile), the folder is synced when fsync is on, a file taken aside is renamed back where hard links
    fail (never removed), and gc removes the '.*.del' files a crash left."""
    storage = make(tmp_path / "s")
    storage.put_bytes("w/p", b"listed")
    listed = storage.modified("w")["w/p"].version
    storage.put_bytes("w/p", b"written again")
    renames: list[str] = []
    syncs: list[Path] = []
    rename = os.rename
    monkeypatch.setattr(local_module.os, "rename", lambda a, b: (renames.append(str(b)), rename(a, b))[1])
    monkeypatch.setattr(local_module, "_fsync_folder", syncs.append)
    assert not storage.delete_if("w/p", listed) and storage.get_bytes("w/p") == b"written again"
    assert renames == []  # checked before any rename
    assert storage.delete_if("w/p", storage.modified("w")["w/p"].version) and not storage.exists("w/p")
    assert syncs == [tmp_path / "s" / "w"]
    assert make(tmp_path / "s", fsync=False).delete_if("w/q", "x") is False and syncs == [tmp_path / "s" / "w"]
    folder = tmp_path / "s" / "w"

    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")  # a filesystem without hard links

    monkeypatch.setattr(local_module.os, "link", no_links)
    (aside := folder / ".p.0123456789ab.del").write_bytes(b"newer")
    local_module._put_back(aside, folder / "p")  # the name free: renamed back, not removed
    assert (folder / "p").read_bytes() == b"newer" and not aside.exists()
    aside.write_bytes(b"older")
    local_module._put_back(aside, folder / "p")  # a file took its place: that one stays
    assert (folder / "p").read_bytes() == b"newer" and not aside.exists()
    # a crash between the rename and the removal: gc's sweep (files taken aside over an hour ago, by the time in
    # their name) puts each back while its name is free, else removes it
    from labswarm.store import FeatureStore, orphans
    from labswarm.store.ops import collect_garbage
    store = FeatureStore.open(tmp_path / "store")
    (written := tmp_path / "store" / "written" / "v1").mkdir(parents=True)
    (left := written / f".p.{time.time_ns()}-0123456789ab.del").write_bytes(b"left by a crash")
    (taken := written / f".q.{time.time_ns()}-0123456789ab.del").write_bytes(b"older")
    (written / "q").write_bytes(b"newer")
    collect_garbage(store, {})
    assert left.exists() and taken.exists()  # taken aside just now: may be a delete in progress
    monkeypatch.setattr(orphans, "ORPHAN_S", 0.0)
    collect_garbage(store, {})
    assert not left.exists() and (written / "p").read_bytes() == b"left by a crash"  # the name free: put back
    assert not taken.exists() and (written / "q").read_bytes() == b"newer"  # the name taken: removed


def test_a_crash_mid_delete_after_a_rewrite_keeps_the_newer_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite lands between delete_if's version check and its rename, and the process dies before putting the
    newer file back (rev2 #6): the sweep puts it back (was: removed as a leftover, the pack gone), ageing it by
    the time in its name, not the file's ctime (a rename need not update it)."""
    storage = make(tmp_path / "s")
    storage.put_bytes("w/p", b"listed")
    listed = storage.modified("w")["w/p"].version
    rename = os.rename

    def rewritten_first(src: object, dst: object) -> None:
        if str(dst).endswith(".del"):
            storage.put_bytes("w/p", b"written again")  # a redelivered message, just after the check
        rename(src, dst)

    def crash(aside: Path, path: Path) -> bool:
        raise RuntimeError("killed before putting it back")

    monkeypatch.setattr(local_module.os, "rename", rewritten_first)
    monkeypatch.setattr(local_module, "_put_back", crash)
    with pytest.raises(StorageError, match="killed before putting it back"):
        storage.delete_if("w/p", listed)
    monkeypatch.undo()
    assert not storage.exists("w/p")
    [aside] = [f for f in (tmp_path / "s" / "w").iterdir() if f.name.endswith(".del")]
    os.utime(aside, (0, 0))  # an old mtime: the sweep must not age it by the file's own times
    assert local_module.remove_aside(tmp_path / "s" / "w", 3600.0) == 0 and aside.exists()  # just now: left
    assert local_module.remove_aside(tmp_path / "s" / "w", -1.0) == 0  # "over -1 s ago": every one
    assert storage.get_bytes("w/p") == b"written again" and not aside.exists()
