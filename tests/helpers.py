"""Shared test helpers: real audio files written with soundfile, small experiments.

Imported by the tests as ``from helpers import ...`` (tests/ is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import numpy as np
import psutil
import pytest
import soundfile as sf

SR = 22050


def write_tone(path: Path, freq: float = 440.0, seconds: float = 2.0, sr: int = SR, channels: int = 1,
               subtype: str = "PCM_16", noise: float = 0.01, seed: int = 0) -> Path:
    """Write a sine (+ a little noise) as a real audio file; the format follows the file extension."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    y = 0.5 * np.sin(2 * np.pi * freq * t) + noise * rng.standard_normal(t.size)
    data = np.stack([y] * channels, axis=1) if channels > 1 else y
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, data.astype(np.float32), sr, subtype=subtype)
    return path


def write_dataset(root: Path, n_per_label: int = 2, seconds: float = 2.0) -> Path:
    """A tiny labelled dataset of tones: ``root/<label>/*.wav`` and ``root/labels.csv``."""
    rows = ["path,label,source"]
    for li, label in enumerate(["low", "high"]):
        for i in range(n_per_label):
            rel = f"{label}/{label}_{i}.wav"
            write_tone(root / rel, freq=220.0 * (li + 1) * (1 + 0.1 * i), seconds=seconds, seed=li * 10 + i)
            rows.append(f"{rel},{label},{label}-src{i}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def experiment_dict(root: Path, store: Path, **overrides) -> dict:
    """An experiment mapping over :func:`write_dataset`'s folder."""
    data = {
        "name": "tones",
        "seed": 0,
        "dataset": {"root": str(root), "sample_rate": SR, "segment": {"start": 0.0, "duration": 2.0}},
        "transformations": [{"name": "identity"}, {"name": "gain", "gain_db": -6.0}],
        "features": [{"name": "mel", "n_mels": 32}, {"name": "mfcc", "n_mfcc": 13}],
        "store": {"root": str(store)},
    }
    data.update(overrides)
    return data


def write_tone_set(root: Path, tones: int = 24, seconds: float = 10.0) -> Path:
    """``tones`` tones of ``seconds`` s in two labels, with ``root/labels.csv``."""
    rows = ["path,label,source"]
    for i in range(tones):
        label = ("low", "high")[i % 2]
        rel = f"{label}/tone_{i:02d}.wav"
        write_tone(root / rel, freq=180.0 + 23.0 * i, seconds=seconds, seed=i)
        rows.append(f"{rel},{label},src{i}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def delete_queue(broker_url: str, name: str) -> None:
    """Delete a RabbitMQ queue if it exists (the broker may be restarting: a few tries)."""
    from kombu import Connection

    for _ in range(20):
        try:
            with Connection(broker_url, connect_timeout=3) as conn:
                conn.default_channel.queue_delete(name)
            return
        except Exception:
            time.sleep(0.5)


def missing(reason: str) -> NoReturn:
    """What a test does when something it needs is not there: skip here, fail in CI (env ``CI=true``), where
    everything the tests need is installed and a skip would hide a test that never runs. Works at module level."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a test must not skip there)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str) -> ModuleType:
    """``module`` imported, or :func:`missing`: ``pytest.importorskip`` that fails in CI instead of skipping."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(f"{module} is not installed ({exc})")


def promtool_check(exposition: str) -> None:
    """Fail with promtool's words unless ``promtool check metrics`` (Debian's ``prometheus`` package) finds
    nothing to say about ``exposition``, a Prometheus text exposition; :func:`missing` without promtool."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool is not installed (Debian package prometheus: .ci/apt-install test)")
    done = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and not done.stdout.strip(), f"promtool check metrics: {done.stdout}{done.stderr}"


#: What the statement that looks up a learner's attempt token holds (once its whitespace is collapsed).
ATTEMPT_TOKEN_LOOKUP = "job_attempts.token_sha256 FROM job_attempts"


@contextmanager
def attempt_token_lookups(engine: Any) -> Iterator[list[str]]:
    """The statements ``engine`` (a SQLAlchemy engine) runs meanwhile that look up an attempt token: a list that
    grows as they run (a count of database lookups, not a timing)."""
    from sqlalchemy import event

    lookups: list[str] = []

    def count(_conn, _cursor, statement: str, *_args) -> None:
        if ATTEMPT_TOKEN_LOOKUP in " ".join(statement.split()):  # compiled with a line break before FROM
            lookups.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield lookups
    finally:
        event.remove(engine, "before_cursor_execute", count)


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` that run (neither gone nor zombies): what a test checks is left after a stop."""
    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 60.0, interval: float = 0.1) -> Any:
    """Poll ``condition`` every ``interval`` s until it returns something true (returned); fails the test after
    ``timeout`` s naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return value
