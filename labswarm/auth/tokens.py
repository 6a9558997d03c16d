"""Named API tokens, hashed at rest: the tokens file (``LABSWARM_TOKENS_FILE``) and what ``labswarm tokens add``
writes to it.

The file is YAML (``.yaml``/``.yml``) or TOML (``.toml``)::

    tokens:                      # TOML: [[tokens]] tables with the same keys
      - name: alice
        role: user               # admin | user
        token_sha256: 3f7a...    # hex SHA-256 of the token; the token itself is never stored
        weight: 2                # optional: fair-share weight and quotas (labswarm.auth.quotas)
        quotas: {queued_jobs: 20}

A token is 32 random bytes, URL-safe base64 (43 characters): its SHA-256 cannot be inverted, so an unsalted
hash is enough (unlike a password, there is no dictionary to try).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from labswarm.errors import ConfigError

Role = Literal["admin", "user"]
ROLES: tuple[str, ...] = ("admin", "user")
#: A user name: what owners are recorded as (letters, digits, ``._-``, 1-64 characters).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: Names of built-in callers: ``LABSWARM_API_TOKEN``, an open loopback manager, the scrape token.
RESERVED = ("admin", "local", "metrics")
_HEX = re.compile(r"^[0-9a-f]{64}$")
#: Characters a token may hold: visible ASCII, no space (what an ``Authorization`` header can carry intact).
TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")


@dataclass(frozen=True)
class User:
    """Who a request comes from.

    Attributes:
        name: the token's name (``admin`` for ``LABSWARM_API_TOKEN``; ``local`` on an open loopback manager).
        role: ``admin`` (sees and controls everything) or ``user`` (their own experiments, sessions and jobs,
            once those record owners).
        scope: ``None`` for a user's token; for a scoped token (a learner's attempt token,
            :mod:`labswarm.jobs.records.credentials`) the one request it opens, ``"METHOD /path"``: any other is a 401.
    """

    name: str
    role: Role
    scope: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class TokenEntry:
    """One named token of the tokens file: its user and the SHA-256 of the token (32 bytes)."""

    user: User
    sha256: bytes


def hash_token(token: str | bytes) -> bytes:
    """The SHA-256 (32 bytes) of a token, as stored and as compared."""
    return hashlib.sha256(token.encode("utf-8") if isinstance(token, str) else token).digest()


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def check_token(token: str, field: str) -> None:
    """Raise :class:`ConfigError` naming ``field`` if ``token`` cannot travel in an ``Authorization`` header
    (empty, a space, a control or non-ASCII character): such a token could never match a request."""
    if not TOKEN_CHARS.match(token):
        raise ConfigError([(field, "a token must be visible ASCII characters without spaces")])


def load_tokens(path: Path) -> list[TokenEntry]:
    """The named tokens of ``path`` (YAML or TOML by suffix; a missing file has none).

    Raises:
        ConfigError: unreadable file, unknown suffix, or an invalid entry (the message names ``tokens[i].key``);
            two entries with one name.
    """
    raw = raw_entries(path)
    entries: list[TokenEntry] = []
    for i, item in enumerate(raw):
        where = f"tokens[{i}]"
        if not isinstance(item, dict):
            raise ConfigError([(where, "expected a mapping with name, role, token_sha256")])
        name, role, digest = item.get("name"), item.get("role", "user"), item.get("token_sha256")
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError([(f"{where}.name", "1-64 letters, digits, '.', '_' or '-'")])
        if role not in ROLES:
            raise ConfigError([(f"{where}.role", f"must be one of {', '.join(ROLES)}")])
        if not isinstance(digest, str) or not _HEX.match(digest):
            raise ConfigError([(f"{where}.token_sha256", "64 lowercase hex digits (the SHA-256 of the token)")])
        if name in RESERVED or any(e.user.name == name for e in entries):
            raise ConfigError([(f"{where}.name", f"{name!r} appears twice or is reserved")])
        entries.append(TokenEntry(User(name, role), bytes.fromhex(digest)))
    return entries


def raw_entries(path: Path) -> list[Any]:
    """The entries of the tokens file ``path`` as read (a missing file has none), unchecked: what
    :func:`load_tokens` and the quotas (:mod:`labswarm.auth.quotas`: ``weight``, ``quotas``) validate.

    Raises:
        ConfigError: unreadable file, unknown suffix, no list under ``tokens``.
    """
    if not path.exists():
        return []
    data = _read(path)
    raw = data.get("tokens", []) if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ConfigError([("tokens", f"{path}: expected a list under 'tokens'")])
    return raw


def add_token(path: Path, name: str, role: str = "user") -> str:
    """Generate a token for a new user ``name``, store its hash in ``path`` (created, mode 0600) and return it:
    the only time the token exists outside the caller's hands.

    Raises:
        ConfigError: invalid name or role, the name exists already, or the file is invalid.
    """
    if not NAME.match(name):
        raise ConfigError([("name", "1-64 letters, digits, '.', '_' or '-'")])
    if role not in ROLES:
        raise ConfigError([("role", f"must be one of {', '.join(ROLES)}")])
    entries = load_tokens(path)
    if name in RESERVED or any(e.user.name == name for e in entries):
        raise ConfigError([("name", f"{name!r} exists already (or is reserved: {', '.join(RESERVED)})")])
    token = new_token()
    rows: list[dict[str, Any]] = list(raw_entries(path))  # as they are: their weights and quotas kept
    rows.append({"name": name, "role": role, "token_sha256": hash_token(token).hex()})
    _write(path, rows)
    return token


def _read(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix in (".yaml", ".yml"):
            return yaml.safe_load(text) or {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        # the parser's message may quote the file: name the file and the error class only
        raise ConfigError([("tokens_file", f"cannot read {path}: {type(exc).__name__}")]) from None
    raise ConfigError([("tokens_file", f"{path}: use a .yaml, .yml or .toml file")])


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    if path.suffix == ".toml":
        text = "".join(_toml_entry(r) for r in rows)
    elif path.suffix in (".yaml", ".yml"):
        text = yaml.safe_dump({"tokens": rows}, sort_keys=False)
    else:
        raise ConfigError([("tokens_file", f"{path}: use a .yaml, .yml or .toml file")])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)


def _toml_entry(row: dict[str, Any]) -> str:
    """One ``[[tokens]]`` table: strings and numbers as JSON writes them (TOML's basic strings share JSON's
    escapes), a ``quotas`` mapping as an inline table (``null``: left out, TOML has none)."""
    lines = ["[[tokens]]"]
    for key, value in row.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items() if v is not None)
            lines.append(f"{key} = {{{inner}}}")
        elif value is not None:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n\n"
