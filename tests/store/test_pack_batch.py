"""labswarm.store.pack_batch: a batch's arrays gathered into written packs of at most max_bytes, each sent as one
pack and its index by the uploads' threads, and each array's callback called once its pack's index is written
(written packs on a local folder's storage: the same objects as on s3, no server needed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from labswarm.storage.local import LocalStorage, LocalStorageConfig
from labswarm.store.pack_batch import PackBatch
from labswarm.store.packs import list_packs, read_index
from labswarm.store.uploads import Uploads
from labswarm.store.written import WRITTEN, WrittenPacks


def test_a_batch_sends_a_pack_each_max_bytes_and_calls_back_once_its_index_is_written(tmp_path: Path) -> None:
    origin = LocalStorage(LocalStorageConfig(path=tmp_path, fsync=False))
    written = WrittenPacks(origin, None, lambda key: key)
    stored: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        uploads = Uploads(pool)
        batch = PackBatch(written, uploads, max_bytes=100)
        batch.add("a" * 40, b"x" * 60, lambda: stored.append("a"))
        batch.add("a" * 40, b"y" * 60, lambda: stored.append("a again"))  # put twice: the later bytes, both calls
        assert list_packs(origin, WRITTEN) == {} and stored == []  # 60 bytes gathered: not sent yet
        batch.add("b" * 40, b"z" * 50, lambda: stored.append("b"))  # 110 >= 100: sent
        batch.add("c" * 40, b"w" * 10, None)
        batch.send()  # the batch's end: the rest as a second pack
        batch.send()  # nothing gathered: nothing sent
        uploads.flush()
    packs = list_packs(origin, WRITTEN)
    contents = sorted(sorted(e.key[0] for e in read_index(origin, name, WRITTEN)) for name in packs)
    assert contents == [["a", "b"], ["c"]]
    assert sorted(stored) == ["a", "a again", "b"]
    location = written.find("a" * 40)
    assert location is not None and location.length == 60
    blob = origin.get_bytes(f"{WRITTEN}/{location.name}.pack")
    assert blob[location.start + location.offset:][:60] == b"y" * 60
