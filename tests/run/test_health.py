"""labswarm run's health thread (labswarm.run.health): the health figure's import starts when the loop first logs
a decision, whether or not a progress poll saw outcomes before the session's final status (rev2 #7: a short or
fully cached session went straight to its final status and imported matplotlib on the run's end path)."""

from __future__ import annotations

from pathlib import Path

from labswarm.health.controllers.base import Observation
from labswarm.health.monitors import ManagerMonitor
from labswarm.run.health import HealthThread, figure_loop


def test_the_figure_import_starts_when_the_loop_first_logs(tmp_path: Path) -> None:
    health = HealthThread("http://127.0.0.1:9", None, None, 1, tmp_path)  # not started: its loop built below
    health._loop.close()  # its event loop is not needed
    quiet = figure_loop(health.prepare_figure, ManagerMonitor("http://127.0.0.1:9", None), log_dir=None)
    session = {"id": "s1", "experiment": "e", "finished": 3, "total": 10}
    observed = Observation(t=1.0, depth=2.0, consume_rate=5.0, consumers=1, rate=5.0)
    quiet._record(session, observed, 6.0, 4.0)
    assert health._plotting is None  # no log, no figure: nothing imported
    loop = figure_loop(health.prepare_figure, ManagerMonitor("http://127.0.0.1:9", None), log_dir=tmp_path)
    loop._record(session, observed, 6.0, 4.0)
    assert (tmp_path / "health-s1.jsonl").is_file()
    plotting = health._plotting
    assert plotting is not None
    loop._record(session, observed, 6.5, 4.0)
    assert health._plotting is plotting  # once
    plotting.join(60)
    assert not plotting.is_alive()
