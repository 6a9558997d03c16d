"""A batch's written packs (:mod:`labswarm.store.written`): the arrays one :meth:`FeatureStore.batch
<labswarm.store.store.FeatureStore.batch>` of a remote store puts, gathered into packs of at most :data:`PACK_MAX`
bytes, each handed to the batch's uploads (:mod:`labswarm.store.uploads`) as one pack and its index."""

from __future__ import annotations

from collections.abc import Callable

from labswarm.store.uploads import Uploads
from labswarm.store.written import WrittenPacks

#: Most bytes of arrays a batch gathers into one pack before it sends it and starts the next (a message of many
#: samples goes out in several packs while it is computed). A process's packs in memory: the one gathered (up to
#: this) beside those handed to :mod:`labswarm.store.uploads` (up to its ``UPLOAD_BYTES`` of arrays), each of which
#: an upload thread encodes into a second copy while it is sent: at most ~2 × UPLOAD_BYTES + PACK_MAX (144 MiB).
PACK_MAX = 16 * 2**20


class PackBatch:
    """The arrays one batch of a remote store writes, gathered into packs: each pack, once :data:`PACK_MAX` bytes
    are gathered or at :meth:`send`, handed to the batch's uploads (a background thread, tried again as any upload),
    and each array's ``stored`` callback called once its pack's index is written."""

    def __init__(self, written: WrittenPacks, uploads: Uploads, max_bytes: int = PACK_MAX) -> None:
        self.written, self.uploads, self.max_bytes = written, uploads, max_bytes
        self._items: dict[str, tuple[bytes, list[Callable[[], None]]]] = {}
        self._bytes = 0

    def add(self, key: str, data: bytes, stored: Callable[[], None] | None) -> None:
        """Gather ``key``'s ``.npy`` bytes (a key put twice: the later bytes, both callbacks)."""
        _old, calls = self._items.get(key, (b"", []))
        self._bytes += len(data) - len(_old)
        self._items[key] = data, calls + ([] if stored is None else [stored])
        if self._bytes >= self.max_bytes:
            self.send()

    def send(self) -> None:
        """Hand what is gathered to the uploads as one pack (nothing when nothing is)."""
        if not self._items:
            return
        items, self._items, self._bytes = self._items, {}, 0
        pairs = [(key, data) for key, (data, _calls) in items.items()]
        size = sum(len(d) for _, d in pairs)

        def done() -> None:
            for _data, calls in items.values():
                for call in calls:
                    call()

        self.uploads.submit(f"a pack of {len(pairs)} arrays", size, lambda: self.written.write(pairs), done)
