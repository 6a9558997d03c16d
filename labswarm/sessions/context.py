"""The runtime a session's parts share (publisher threads, reconciliation, launchers), passed down by the
:class:`~labswarm.sessions.service.SessionService` that builds it: never the service itself, so that no part
reaches back into its parent.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from labswarm.sessions.broker import BrokerClient
from labswarm.settings import Settings


@dataclass(frozen=True)
class SessionContext:
    """What the session service hands down to the parts of a session.

    Attributes:
        db: opens a new database session (use as a context manager); the ledger and the session rows live there.
        settings: the runtime settings (attempts, rates, windows, launchers' settings).
        broker: the broker client the publishers publish with (queue depths, purges).
        on_end: called with a session's id, from its publisher's thread, as soon as that publisher has ended the
            session (completed or failed; before its workers are stopped): ``labswarm run`` sees its session's end
            at once instead of at its next poll. A listener must return quickly and not raise.
    """

    db: Callable[[], AbstractContextManager[Session]]
    settings: Settings
    broker: BrokerClient
    on_end: list[Callable[[str], None]] = field(default_factory=list)
