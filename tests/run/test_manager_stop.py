"""`labswarm run`'s own manager stops once on every path, and its stop's error is the run's only where the run raised
nothing of its own (run/manager_stop.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest
from helpers import alive, experiment_dict, write_dataset

from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


@pytest.mark.slow  # a whole labswarm run: its manager, a worker process, 8 samples (~10-20 s under load)
def test_a_ctrl_c_during_the_figure_leaves_the_manager_stopped_once_and_comes_out_with_the_stop_error_as_a_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the health figure is drawn, as the manager stops in its thread, and that stop fails after
    stopping everything: the run waits for that stop, stops nothing twice, raises the KeyboardInterrupt (labswarm
    run's exit 130) with the stop's error as a note, leaves no process and releases its lock. Fails with 200c42a's
    experiment.py (the stop's RuntimeError replaced the KeyboardInterrupt) and with the one before it (two stops,
    the thread's error lost)."""
    import labswarm.run.experiment as experiment
    from labswarm.config.experiment import parse_experiment
    from labswarm.run import RunOptions, run_experiment
    from labswarm.run.adopt import RunLock

    stops: list[str] = []
    real_stop = EmbeddedServer.stop

    def stop(self: EmbeddedServer, timeout: float = 15.0) -> None:
        stops.append(threading.current_thread().name)
        real_stop(self, timeout)
        raise RuntimeError("the manager's shutdown failed")

    def figure(log_dir: Path, session_id: str) -> Path:
        raise KeyboardInterrupt  # Ctrl-C while it is drawn

    monkeypatch.setattr(EmbeddedServer, "stop", stop)
    monkeypatch.setattr(experiment, "health_figure", figure)
    config = parse_experiment(experiment_dict(write_dataset(tmp_path / "data", n_per_label=2), tmp_path / "store"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(KeyboardInterrupt) as raised:
        run_experiment(config, RunOptions(workers=1), settings=Settings(home=tmp_path / "home"))
    assert raised.value.__notes__ == ["manager stop failed: RuntimeError(\"the manager's shutdown failed\")"]
    assert stops == ["labswarm-manager-stop"], stops  # once, in its thread
    left = [p for p in alive(psutil.Process().children(recursive=True)) if p.pid not in before]
    assert left == [], [(p.pid, p.cmdline()[-4:]) for p in left]
    with RunLock(tmp_path / "home", config.name):  # released: the next run of the experiment takes it
        pass


class _Failing:
    """A manager whose stop fails (after stopping, say): what :class:`ManagerStop` is handed."""

    def stop(self) -> None:
        raise RuntimeError("the manager's shutdown failed")


def test_the_stop_error_is_raised_only_where_the_run_raised_nothing_else_a_note_on_the_runs_own(
        caplog: pytest.LogCaptureFixture) -> None:
    from labswarm.errors import ConfigError
    from labswarm.run.manager_stop import ManagerStop

    alone = ManagerStop(_Failing())  # type: ignore[arg-type]  # only its stop() is called
    alone.finish()
    with pytest.raises(RuntimeError, match="shutdown failed"):
        alone.raise_error(None)  # the run raised nothing: the stop's error is the run's
    primary = ConfigError([("training", "missing")])
    beside = ManagerStop(_Failing())  # type: ignore[arg-type]
    beside.finish()
    beside.raise_error(primary)  # the run's own ConfigError goes on (exit 2): nothing raised here
    assert primary.__notes__ == ["manager stop failed: RuntimeError(\"the manager's shutdown failed\")"]
    assert "the manager's stop failed too" in caplog.text and "shutdown failed" in caplog.text
    ManagerStop(None).raise_error(None)  # a remote manager: nothing stopped, nothing raised
