"""A session start reads its labels CSV once: the rows are checked against the data roots and counted in the same
pass (it was read three times: the registry's first check in the process, the start's check, the count)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.sample import count_samples
from labswarm.sessions.service import SessionService
from labswarm.settings import Settings

#: While set, the files opened by the main thread are recorded here (an audit hook stays for the whole process:
#: it does nothing else).
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if (_OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike))
            and threading.current_thread() is threading.main_thread()):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SessionService]:
    svc = SessionService(Settings(home=tmp_path / "home", data_roots=[tmp_path]))  # the embedded broker
    try:
        yield svc
    finally:
        svc.stop()
        svc.engine.dispose()


def test_a_session_start_reads_the_labels_csv_once_and_counts_its_rows(service: SessionService,
                                                                      tone_dataset: Path, tmp_path: Path) -> None:
    global _OPENED
    experiment = experiment_dict(tone_dataset, tmp_path / "store", name="once")
    service.registry.register(experiment)  # its rows checked; the configuration is read again at the start
    labels = os.path.realpath(tone_dataset / "labels.csv")
    _OPENED = []
    try:
        row = service.start_session("once", rate=0.01)  # the publisher (its own thread) reads it too: not counted
        opened, _OPENED = _OPENED, None
    finally:
        _OPENED = None
    assert opened.count(labels) == 1, opened
    assert row.total == count_samples(parse_experiment(experiment)) == 8  # 4 clips x 2 transformations
