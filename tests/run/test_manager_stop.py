"""`labswarm run`'s own manager stops once on every path, and its stop's error is the run's (run/manager_stop.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest
from helpers import alive, experiment_dict, write_dataset

from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


@pytest.mark.slow  # a whole labswarm run: its manager, a worker process, 8 samples (~10-20 s under load)
def test_a_figure_that_raises_leaves_the_manager_stopped_once_and_the_stop_error_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The health figure fails (a full disk) while the manager stops in its thread, and that stop fails after
    stopping everything: the run waits for that stop, stops nothing twice, raises the stop's error (the figure's
    as its context), leaves no process and releases its lock. Before, the stop thread was dropped, the run's
    ``finally`` stopped the manager a second time beside it, and the thread's error reached only
    threading.excepthook (fails so: two stops, the figure's OSError raised)."""
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
        raise OSError(28, "No space left on device", str(log_dir / f"health-{session_id}.png"))

    monkeypatch.setattr(EmbeddedServer, "stop", stop)
    monkeypatch.setattr(experiment, "health_figure", figure)
    config = parse_experiment(experiment_dict(write_dataset(tmp_path / "data", n_per_label=2), tmp_path / "store"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="shutdown failed") as raised:
        run_experiment(config, RunOptions(workers=1), settings=Settings(home=tmp_path / "home"))
    assert isinstance(raised.value.__context__, OSError), raised.value.__context__
    assert stops == ["labswarm-manager-stop"], stops  # once, in its thread
    left = [p for p in alive(psutil.Process().children(recursive=True)) if p.pid not in before]
    assert left == [], [(p.pid, p.cmdline()[-4:]) for p in left]
    with RunLock(tmp_path / "home", config.name):  # released: the next run of the experiment takes it
        pass
