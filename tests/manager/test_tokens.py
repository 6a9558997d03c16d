"""The tokens file: hashed at rest (YAML and TOML), ``labswarm tokens add`` prints the token once and stores only
its hash, and a manager started on the file accepts that token as that user."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from labswarm.auth.tokens import add_token, load_tokens
from labswarm.errors import ConfigError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LABSWARM_")}
    return subprocess.run([sys.executable, "-m", "labswarm.cli", "tokens", *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_cli_prints_the_token_once_and_stores_its_hash_only(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"tokens{suffix}"
    first = _cli("add", "alice", "--file", str(path))
    assert first.returncode == 0, first.stderr
    [token] = first.stdout.split()  # stdout: the token alone
    assert len(token) >= 40 and token not in first.stderr
    second = _cli("add", "bob", "--role", "admin", env={"LABSWARM_TOKENS_FILE": str(path)})
    assert second.returncode == 0, second.stderr
    [bob] = second.stdout.split()
    text = path.read_text()
    assert token not in text and bob not in text
    assert hashlib.sha256(token.encode()).hexdigest() in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [(e.user.name, e.user.role) for e in load_tokens(path)] == [("alice", "user"), ("bob", "admin")]
    listed = _cli("list", "--file", str(path))
    assert listed.returncode == 0 and "alice" in listed.stdout and token not in listed.stdout
    again = _cli("add", "alice", "--file", str(path))
    assert again.returncode == 2 and "exists" in again.stderr and again.stdout == ""  # usage

    with EmbeddedServer(create_app(Settings(home=tmp_path / "home", tokens_file=path))) as server, \
            httpx.Client(base_url=server.url, timeout=10.0) as http:
        assert http.get("/experiments", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert http.get("/experiments", headers={"Authorization": f"Bearer {bob}"}).status_code == 200
        assert http.get("/experiments", headers={"Authorization": f"Bearer {token[:-1]}"}).status_code == 401


def test_cli_without_a_file_says_so(tmp_path: Path) -> None:
    done = _cli("add", "alice")
    assert done.returncode == 2 and "LABSWARM_TOKENS_FILE" in done.stderr


def test_invalid_files_and_names_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    with pytest.raises(ConfigError, match="name"):
        add_token(path, "bad name")
    with pytest.raises(ConfigError, match="role"):
        add_token(path, "carol", "root")
    with pytest.raises(ConfigError, match="reserved"):
        add_token(path, "admin")
    path.write_text("tokens:\n  - name: dave\n    role: user\n    token_sha256: not-a-hash\n")
    with pytest.raises(ConfigError, match=r"tokens\[0\]\.token_sha256"):
        load_tokens(path)
    path.write_text("tokens: [unclosed\n  root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(ConfigError) as info:
        load_tokens(path)
    assert "root:x" not in str(info.value)  # the file's contents are never quoted
    with pytest.raises(ConfigError, match="yaml"):
        add_token(tmp_path / "tokens.txt", "erin")
