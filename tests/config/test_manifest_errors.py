"""A misspelled key of a job manifest is answered with the key it likely meant (issue 29, item 9), as an
experiment's is: at the top, in the restart policy, in the training overrides and in a framework's parameters."""

from __future__ import annotations

import pytest

from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError

BASE = {"name": "j", "experiment": "three", "results_store": {"name": "local", "path": "r"}}


@pytest.mark.parametrize(("change", "path", "suggested"), [
    ({"trainin": {"epochs": 1}}, "trainin", "training"),
    ({"restart": {"backof_s": 1}}, "restart.backof_s", "backoff_s"),
    ({"training": {"learnin_rate": 0.1}}, "training.learnin_rate", "learning_rate"),
    ({"framework": {"name": "allreduce", "topolgy": 1}, "learners": 2}, "framework.topolgy", "topology"),
])
def test_a_misspelled_manifest_key_names_the_known_one(change: dict, path: str, suggested: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_manifest({**BASE, **change})
    errors = dict(raised.value.errors)
    assert errors[path].startswith(f"unknown key {path.rsplit('.', 1)[-1]!r}: did you mean {suggested!r}? (known: ")
    assert "Extra inputs are not permitted" not in str(raised.value)
