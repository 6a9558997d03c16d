"""labswarm.storage.keys: what a storage key may be, and how a prefix and a key join (every backend's contract
tests check the same rules through its operations: tests/jobs/storage/test_base.py)."""

from __future__ import annotations

import pytest

from labswarm.errors import StorageError
from labswarm.storage import MAX_KEY_BYTES as REEXPORTED
from labswarm.storage import check_key as reexported
from labswarm.storage.keys import MAX_KEY_BYTES, check_key, join_keys


def test_check_key_normalizes_a_trailing_slash_and_names_the_reason() -> None:
    assert check_key("a/b/") == "a/b"
    assert check_key("", allow_empty=True) == ""
    with pytest.raises(StorageError, match="relative"):
        check_key("/", allow_empty=True)
    with pytest.raises(StorageError, match=r"'\.\.' segment"):
        check_key("a/../b")
    with pytest.raises(StorageError, match=r"start with '\.'"):
        check_key("a/.tmp")
    assert (reexported, REEXPORTED) == (check_key, MAX_KEY_BYTES)  # the package's names are these


def test_join_keys_leaves_empty_parts_out() -> None:
    assert join_keys("", "a/b", "", "c") == "a/b/c"
    assert join_keys("", "") == ""
