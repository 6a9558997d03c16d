"""Launcher orchestration: the workers the manager runs for its sessions (started, scaled, stopped, restored)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import select

from labswarm.auth.overrides import PolicyStore
from labswarm.auth.quotas import QuotaExceeded
from labswarm.deploy.base import Host, Launcher
from labswarm.deploy.sessions import NONE, session_launcher
from labswarm.errors import ConfigError, Conflict, DeployError, LabswarmError, NotFound
from labswarm.sessions.context import SessionContext
from labswarm.sessions.models import ACTIVE, SessionRow, known_session

log = logging.getLogger(__name__)


class SessionLaunchers:
    """The launcher of each active session whose workers the manager runs.

    Args:
        context: the runtime of the sessions (database, settings).
        fail_session: called with a session's id and the reason when its launcher cannot start its workers: the
            session fails (:meth:`SessionService.fail_session`).
        policies: the users' quotas: a session's owner may not have more workers run by the manager for their
            sessions together than their ``workers`` quota (:mod:`labswarm.auth.quotas`).

    Attributes:
        host: what the process serving the manager knows about itself (its URL from this machine, the local
            workers' pool size and log folder); set by that process before it serves
            (:func:`~labswarm.manager.server.advertise`) and given to each launcher (``Launcher.bind``).
    """

    def __init__(self, context: SessionContext, fail_session: Callable[[str, str], None],
                 policies: PolicyStore | None = None) -> None:
        self.context = context
        self._fail_session = fail_session
        self.policies = policies
        self.host = Host()
        self._launchers: dict[str, Launcher] = {}
        self._asked: dict[str, int] = {}  # the workers each session was started or last scaled with
        self._quota_lock = threading.Lock()  # a quota's check and the change it admits, one user's at a time
        self._stopping: dict[str, Launcher] = {}  # launchers being stopped now (by a session's end)

    def get(self, session_id: str) -> Launcher | None:
        """The launcher of a session, if the manager runs its workers."""
        return self._launchers.get(session_id)

    def launch(self, session_id: str, launcher: str, workers: int) -> None:
        """Start ``workers`` workers for an active session with the launcher named ``launcher``.

        ``none`` starts nothing (workers are run by someone else). The launcher is recorded with the session: the
        manager scales it (:meth:`scale`), stops it when the session ends or is cancelled, and finds it
        again after a restart. A session that has already ended (e.g. every sample was cached, so it completed
        right after it started) has nothing left to run: nothing is started. One that ends while its
        workers start has them stopped again.

        Raises:
            NotFound: no such session.
            Conflict: the session already has a launcher.
            ConfigError: unknown launcher name, or invalid ``swarm_*`` settings; the session is then failed.
            DeployError: the workers could not be started; the session is then failed with that reason.
            QuotaExceeded: ``workers`` would take the session's owner past their ``workers`` quota (HTTP 429);
                the session is then failed with that reason (the API checks first: :meth:`admit`).
            ValueError: ``workers`` < 0.
        """
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        row = self._session(session_id)
        if launcher == NONE:
            return
        if row.status not in ACTIVE:
            return  # it ended already (all samples cached, cancelled, failed): no workers to run
        if session_id in self._launchers:
            raise Conflict(f"session {session_id} already has its launcher")
        try:
            with self._quota_lock:
                self.admit(row.owner, workers, session_id)
                self._asked[session_id] = workers
            instance = session_launcher(launcher, row.experiment, session_id, self.context.settings)
            assert instance is not None, f"a launcher other than {NONE!r} is made"
            instance.bind(self.host)
            instance.start(workers)
        except (ConfigError, DeployError, QuotaExceeded) as exc:
            self._asked.pop(session_id, None)
            self._fail_session(session_id, f"{launcher} launcher: {exc}")
            raise
        # registered before the status is read again: a session that ends from now on finds its launcher in
        # stop(); one that ended during start() is seen here. stop() pops it, so exactly one of the two stops it
        self._launchers[session_id] = instance
        with self.context.db() as db:
            current = known_session(db, session_id)
            current.launcher = launcher
            db.commit()
            ended = current.status not in ACTIVE
        if ended:
            self.stop(session_id)

    def scale(self, session_id: str, workers: int) -> None:
        """Run ``workers`` workers for an active session from now on, through its launcher.

        Raises:
            NotFound: no such session.
            Conflict: the session has ended, or its workers are not the manager's (launcher ``none``).
            DeployError: the launcher failed (e.g. the Docker engine refused).
            QuotaExceeded: ``workers`` would take the session's owner past their ``workers`` quota (HTTP 429);
                nothing changes.
            ValueError: ``workers`` < 0.
        """
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        row = self._session(session_id)
        if row.status not in ACTIVE:
            raise Conflict(f"session {session_id} is {row.status}")
        launcher = self._launchers.get(session_id)
        if launcher is None:
            raise Conflict(f"session {session_id} has no launcher (started with launcher {row.launcher!r}): its "
                           "workers are started outside the manager (labswarm worker ...)")
        with self._quota_lock:
            self.admit(row.owner, workers, session_id)
            before, self._asked[session_id] = self._asked.get(session_id), workers
        try:
            launcher.scale(workers)
        except LabswarmError:
            if before is not None:
                self._asked[session_id] = before
            else:  # a session restored after a restart: not charged for workers that never ran
                self._asked.pop(session_id, None)
            raise

    def admit(self, owner: str, workers: int, session_id: str | None = None) -> None:
        """Check that the manager may run ``workers`` workers for a session of ``owner`` (``session_id``: the
        session scaled, whose workers now are replaced; ``None``: a session about to start) under their ``workers``
        quota: the workers it runs for their other active sessions (as started or last scaled; after a manager
        restart, those running) plus ``workers``.

        Raises:
            QuotaExceeded: over the quota (HTTP 429, the quota named).
        """
        policy = self.policies.of(owner) if self.policies is not None else None
        if policy is None or policy.workers is None:
            return
        with self.context.db() as db:
            mine = list(db.scalars(select(SessionRow.id).where(
                SessionRow.owner == owner, SessionRow.status.in_([state.value for state in ACTIVE]))))
        used = 0
        for sid in mine:
            if sid == session_id:
                continue
            asked = self._asked.get(sid)
            if asked is None and (launcher := self._launchers.get(sid)) is not None:
                asked = launcher.workers  # restored after a restart: what runs
            used += asked or 0
        policy.check(owner, "workers", used, workers)

    def restore(self) -> None:
        """Rebuild the launchers of the active sessions that have one (after a manager restart)."""
        with self.context.db() as db:
            rows = list(db.execute(select(SessionRow.id, SessionRow.experiment, SessionRow.launcher)
                                   .where(SessionRow.status.in_(ACTIVE), SessionRow.launcher != NONE)))
        for session_id, experiment, name in rows:
            try:
                instance = session_launcher(name, experiment, session_id, self.context.settings)
            except LabswarmError as exc:
                log.error("session %s: cannot restore its %s launcher: %s", session_id, name, exc)
                continue
            if instance is None:
                continue
            instance.bind(self.host)
            if not instance.outlives_owner:
                # its workers stopped with the previous manager process; how many it ran is not recorded
                log.warning("session %s: its %s workers stopped with the previous manager; it has none until they "
                            "are scaled again (PUT /sessions/%s/workers; a labswarm run taking the session over does "
                            "so itself)", session_id, name, session_id)
            self._launchers.setdefault(session_id, instance)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the workers that do not outlive this process (``local``), when the process serving the manager
        stops; the others (a swarm service) keep running for the next manager process to find. Errors are logged.
        """
        owned = [sid for sid, launcher in list(self._launchers.items()) if not launcher.outlives_owner]
        # a launcher a session's end is stopping now is stopped again: its stop() waits for the one under way
        stopping = [(sid, launcher) for sid, launcher in list(self._stopping.items()) if not launcher.outlives_owner]
        for session_id, launcher in [(sid, self._launchers.pop(sid, None)) for sid in owned] + stopping:
            if launcher is None:
                continue
            try:
                launcher.stop(timeout)
            except LabswarmError as exc:
                log.error("session %s: cannot stop its workers: %s", session_id, exc)

    def stop(self, session_id: str, raise_errors: bool = False) -> None:
        """Stop the workers of a session that ended, if the manager started them.

        Raises:
            LabswarmError: only with ``raise_errors``: the launcher could not stop them (else logged).
        """
        launcher = self._launchers.get(session_id)
        if launcher is None:
            return
        self._stopping[session_id] = launcher  # before the pop: close() sees it in one of the two at any time
        self._asked.pop(session_id, None)
        if self._launchers.pop(session_id, None) is None:
            return  # another thread stops it
        try:
            launcher.stop()
        except LabswarmError as exc:
            log.error("session %s: cannot stop its workers: %s", session_id, exc)
            if raise_errors:
                raise
        finally:
            self._stopping.pop(session_id, None)

    def _session(self, session_id: str) -> SessionRow:
        """The row of a session.

        Raises:
            NotFound: no such session.
        """
        with self.context.db() as db:
            row = db.get(SessionRow, session_id)
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return row
