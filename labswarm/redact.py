"""Masking secrets in what labswarm shows: URLs in log lines, error messages and command lines."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

#: What replaces a password.
MASK = "***"
#: ``scheme://user:password@`` anywhere in a text (several URLs, or a URL inside a message).
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*):(?P<password>[^\s@/]*)@")


def redact_url(url: str | None) -> str | None:
    """``url`` with its password replaced by ``***`` (``amqp://u:s3cr3t@h:5672//`` -> ``amqp://u:***@h:5672//``).

    A URL without a password is returned as it is; ``None`` stays ``None``. The query string is kept (no
    known broker or database URL of labswarm carries a secret there).
    """
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL urllib can split: mask what looks like user:password@
        return redact_text(url)
    if not password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it masked (log lines, messages)."""
    return _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)


def has_password(url: str | None) -> bool:
    """Whether ``url`` carries a password (``scheme://user:password@host``)."""
    if not url:
        return False
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return bool(_USERINFO.search(url))
