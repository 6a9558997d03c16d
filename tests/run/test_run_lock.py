"""A ``labswarm run`` refused by its lock (another run of the experiment holds it on this home,
:class:`~labswarm.run.adopt.RunLock`) starts nothing: no standby worker interpreter (:mod:`labswarm.deploy.standby`)
is left behind warming up for a run that never happens."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from helpers import experiment_dict, write_dataset

from labswarm.config.experiment import parse_experiment
from labswarm.deploy.standby import MODULE
from labswarm.errors import LabswarmError
from labswarm.run.adopt import RunLock
from labswarm.run.experiment import RunOptions, run_experiment
from labswarm.settings import Settings


def standbys() -> set[int]:
    """Process ids of this process's standby worker children (``python -m labswarm.cli.standby``)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if MODULE in child.cmdline():
                found.add(child.pid)
        except psutil.Error:  # ended meanwhile
            continue
    return found


def test_a_run_refused_by_the_lock_leaves_no_standby_worker(tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(write_dataset(tmp_path / "data", seconds=0.5), tmp_path / "store"))
    home = tmp_path / "home"
    before = standbys()
    with RunLock(home, config.name):  # the first run's, held while the second one starts
        with pytest.raises(LabswarmError, match="another labswarm run"):
            run_experiment(config, RunOptions(workers=2, health=False), settings=Settings(home=home))
        # a standby is started (Popen) before the constructor returns: none now means none was started
        assert standbys() - before == set()
