"""The peak bytes a cold :meth:`FeatureStore.fetch` holds, measured in a process of its own for
``tests/store/test_fetch.py``: tracemalloc traces every thread of its process, so in the pytest process another
thread's allocations during the fetch (an idle pool, a reporter, a module's server) would count as the fetch's.

``python fetch_peak.py '{"root": PATH, "spec": {...}, "keys": [...], "threads": N, "packs": N}'`` prints
``{"peak": BYTES}``: the peak over the traced memory before the fetch of every key, the cache's first write held
back until the threads have fetched all they may before they wait for it (``threads + PENDING`` packs, at most
``packs``): the worst case, whatever the load. The AWS credential variables come from the environment.
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc

from labswarm.storage.cache import CachedStorage
from labswarm.store import FeatureStore
from labswarm.store.packs import PENDING


def peak(root: str, spec: dict, keys: list[str], threads: int, packs: int) -> int:
    """See the module docstring."""
    store = FeatureStore.open(root, remote=spec, cache_bytes=1 << 30)
    assert store.packs is not None and isinstance(store.storage, CachedStorage)
    store.packs.catalogue()  # listed before the measure: a learner lists its store when it starts
    cache, reader = store.storage, store.packs
    insert = cache.insert

    def held_back(items: list) -> int:
        deadline = time.monotonic() + 60
        while len(reader._pending) < min(threads + PENDING, packs) and time.monotonic() < deadline:
            time.sleep(0.01)
        cache.insert = insert  # type: ignore[method-assign]
        return insert(items)

    cache.insert = held_back  # type: ignore[method-assign]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fetched = store.fetch(keys, threads)
        assert fetched == packs, (fetched, packs)
        reader.wait()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps({"peak": peak(args["root"], args["spec"], args["keys"], args["threads"], args["packs"])}))
