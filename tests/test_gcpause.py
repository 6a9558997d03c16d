"""labswarm.gcpause.collector_paused: the collector off inside the block and as it was after; with freeze, the
block's garbage collected and what is left frozen, unless the block failed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from labswarm.gcpause import collector_paused


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test's frozen objects back in the collector's sight, and the collector on, after the test."""
    enabled = gc.isenabled()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def test_paused_then_as_before_and_frozen_only_when_the_block_succeeds(unfrozen: None) -> None:
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # off before: left off (a worker's CLI paused it around its imports)
    gc.enable()
    gc.unfreeze()
    frozen = gc.get_freeze_count()
    with collector_paused(freeze=True):
        garbage = weakref.ref(_Node())  # unreachable, in a cycle: freed by the block's collection, not frozen
        kept = _Node()
        assert gc.get_freeze_count() == frozen
    assert garbage() is None and gc.get_freeze_count() > frozen and gc.isenabled()
    assert kept.me is kept
    gc.unfreeze()
    with pytest.raises(RuntimeError), collector_paused(freeze=True):
        raise RuntimeError("a failed warm-up")
    assert gc.get_freeze_count() == 0 and gc.isenabled()
