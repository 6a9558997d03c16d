"""labswarm.cli.store_trim: ``store trim``'s size parsing and its refusal of a bad size (exit 2, naming
``--max-bytes``) before it asks the manager anything; the command against a real manager and session:
tests/store/test_store_trim_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from labswarm.cli.exits import USAGE
from labswarm.cli.main import app
from labswarm.cli.store_trim import _size
from labswarm.errors import ConfigError


def test_sizes_are_powers_of_1024_and_a_bad_one_names_the_option(tmp_path: Path) -> None:
    assert [_size(t) for t in ("1048576", "50G", "500MiB", "1.5k", "2kb")] == [2**20, 50 * 2**30, 500 * 2**20,
                                                                              1536, 2048]
    with pytest.raises(ConfigError, match="--max-bytes"):
        _size("5X")
    result = CliRunner().invoke(app, ["store", "trim", "--max-bytes", "5X", "--store", str(tmp_path),
                                      "--manager", "http://127.0.0.1:9"])  # nothing listens: never asked
    assert result.exit_code == USAGE, result.output
    assert "--max-bytes" in result.output
