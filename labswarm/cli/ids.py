"""Ids a person can type: a session's or a job's id may be given by any unique prefix (``labswarm sessions show
b457``), as git takes commits. A whole id (:data:`ID_LENGTH` characters) is used as it is, with no extra request;
a shorter one is looked up among the ids the token may see; none matching is an unknown id, several are answered
with the candidates (both exit status 2)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from labswarm.errors import Conflict, NotFound

#: The length of a whole session or job id (12 hex digits).
ID_LENGTH = 12
#: Candidates named in the answer to an ambiguous prefix.
MAX_CANDIDATES = 10


def resolve(prefix: str, kind: str, ids: Callable[[], Iterable[str]]) -> str:
    """The one id of ``ids()`` that starts with ``prefix``; ``prefix`` itself when it is a whole id.

    Args:
        prefix: what the user typed.
        kind: ``session`` or ``job``, for the messages.
        ids: every id the user may name (called only for a prefix).

    Raises:
        NotFound: no id starts with ``prefix``.
        Conflict: several do (the message names them, newest first, at most :data:`MAX_CANDIDATES`).
    """
    if len(prefix) >= ID_LENGTH:
        return prefix
    matches = list(dict.fromkeys(i for i in ids() if i.startswith(prefix))) if prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NotFound(f"no {kind} whose id starts with {prefix!r} (see `labswarm {kind}s list`)")
    shown = ", ".join(matches[:MAX_CANDIDATES]) + (", ..." if len(matches) > MAX_CANDIDATES else "")
    raise Conflict(f"{prefix!r} is the start of {len(matches)} {kind} ids: {shown}; type more of the id")


def session_ids(client: Any, page: int = 1000) -> Iterator[str]:
    """The ids of every session ``client`` (a :class:`~labswarm.client.ManagerClient`) may see, newest first."""
    offset = 0
    while True:
        sessions = client.sessions(limit=page, offset=offset)
        yield from (s["id"] for s in sessions)
        if len(sessions) < page:
            return
        offset += page


def job_ids(client: Any, page: int = 500) -> Iterator[str]:
    """The ids of every job ``client`` (a :class:`~labswarm.jobs.client.client.JobsClient`) may see, newest
    first."""
    offset = 0
    while True:
        answer = client.list(offset=offset, limit=page)
        yield from (j["id"] for j in answer["jobs"])
        offset += page
        if offset >= answer["total"] or not answer["jobs"]:
            return
