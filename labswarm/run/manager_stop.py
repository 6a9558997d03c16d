"""The stop of ``labswarm run``'s own manager: once, in a thread while the run draws its health figure, waited for
on every path (:func:`labswarm.run.experiment.run_experiment`)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labswarm.manager.server import EmbeddedServer

log = logging.getLogger(__name__)


class ManagerStop:
    """Stops the run's own manager (``server``; ``None``: a remote manager, nothing to stop) exactly once: in a
    thread from :meth:`start`, while the run draws the health figure (issue 27: the end of a short run), else in
    :meth:`finish`. A second stop beside the first could return before the workers had stopped (the run's lock
    released meanwhile), and an error in the thread reached only :func:`threading.excepthook` (the run exited 0).
    """

    def __init__(self, server: EmbeddedServer | None) -> None:
        self.server = server
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _stop(self) -> None:
        assert self.server is not None, "start() checked it"
        try:
            self.server.stop()
        except BaseException as exc:  # handed to the run's thread by finish()
            self.error = exc

    def start(self) -> None:
        """Begin the stop in a thread (once; a remote manager: nothing)."""
        if self.server is not None and self._thread is None:
            self._thread = threading.Thread(target=self._stop, name="labswarm-manager-stop", daemon=True)
            self._thread.start()

    def finish(self) -> BaseException | None:
        """Stop the manager, or wait for the stop :meth:`start` began (its workers' stop included): its exception
        is returned, not raised (the caller's own cleanup first), ``None`` when it stopped."""
        if self._thread is None:
            self.start()
        if self._thread is not None:
            self._thread.join()
        return self.error

    def raise_error(self, primary: BaseException | None) -> None:
        """After :meth:`finish`, in the run's ``finally``: raise the stop's error where the run itself raised nothing
        (``primary`` is ``None``). Where it raised, its own exception goes on (a Ctrl-C's ``KeyboardInterrupt``:
        exit 130; a ``ConfigError``: exit 2; a ``ManagerError``: exit 3): the stop's error is logged and added to it
        as a note (``manager stop failed: ...``) rather than replacing it.

        Raises:
            BaseException: the stop's error, where ``primary`` is ``None``.
        """
        if self.error is None:
            return
        if primary is None:
            raise self.error
        log.error("the manager's stop failed too (the run's own %s goes on)", type(primary).__name__,
                  exc_info=self.error)
        primary.add_note(f"manager stop failed: {self.error!r}")
