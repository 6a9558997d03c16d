"""Sessions: the experiment registry, session lifecycle, publisher, ledger and reconciliation.

The manager (:mod:`labswarm.manager.api`) hosts :class:`SessionService` and mounts its routes.
"""

from labswarm.sessions.service import SessionService

__all__ = ["SessionService"]
