"""The ``command`` framework: any learner program (the DLaaS ``train.sh`` route), run by a learner.

The program runs in the learner's working folder, in its own process group, with these variables on top of the
learner's environment:

====================== =============================================================================
``LABSWARM_JOB_ID``    the job's id
``LABSWARM_ATTEMPT``   the attempt number (from 1)
``LABSWARM_RANK``      this learner's rank; ``LABSWARM_WORLD_SIZE``: the number of learners
``MASTER_ADDR``        the rendezvous of distributed learners (with ``MASTER_PORT``), when there is one
``LABSWARM_DATA_DIR``  the data store's folder, when it is a ``local`` store
``LABSWARM_DATA_STORE`` the data store's spec as JSON (no credential: those stay in the environment)
``LABSWARM_RESULTS_DIR`` a folder whose files are stored under ``results/`` in the results store at exit
``LABSWARM_CHECKPOINT_DIR`` a folder filled with the last committed checkpoint at start; what it holds at exit
                       is committed as this attempt's checkpoint (write it there on SIGTERM to halt well)
``LABSWARM_METRICS_FILE`` the JSON-lines metrics file (``framework.metrics.jsonl``), when there is one
====================== =============================================================================

Its output (stdout and stderr, merged) goes to the learner's log line by line; metrics come from the JSON-lines
file it appends to (read as it grows) or from the manifest's regular expressions over its output. A record with
an ``epoch`` is kept once per job by the manager (a restarted attempt may report it again). A halt sends SIGTERM
to the program's process group; the learner then exits with
:data:`~labswarm.jobs.spec.errors.EXIT_HALTED` (unless the program finished anyway: its own code).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from labswarm.config.manifest import CommandFramework
from labswarm.deploy.learners import PROGRAM_FILE
from labswarm.jobs.learner.context import LearnerContext
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import EXIT_HALTED
from labswarm.storage.base import Storage

log = logging.getLogger("labswarm.learner")


def run_command(learner: LearnerContext) -> int:
    """Run the manifest's program to its end (or its halt); returns the learner's exit code.

    Raises:
        StorageError: the checkpoint or the results could not be moved.
    """
    framework = learner.manifest.framework
    assert isinstance(framework, CommandFramework)
    spec, workdir = learner.spec, learner.workdir
    results, checkpoint = workdir / "results", workdir / "checkpoint"
    for folder in (results, checkpoint):
        folder.mkdir(parents=True, exist_ok=True)
    if spec.checkpoint is not None and spec.checkpoint.get("kind") == "folder":
        _download(learner.storage, spec.checkpoint["key"], checkpoint)
    metrics = framework.metrics
    jsonl = workdir / metrics.jsonl if metrics is not None and metrics.jsonl else None
    env = {**os.environ, **_environment(learner, results, checkpoint, jsonl)}
    env.pop("LABSWARM_API_TOKEN", None)  # the program has no business with the manager's token
    try:
        process = subprocess.Popen(framework.command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    except FileNotFoundError as exc:
        log.error("cannot run %s: %s", framework.command[0], exc.strerror or exc)
        return 127
    except PermissionError as exc:
        log.error("cannot run %s: %s", framework.command[0], exc.strerror or exc)
        return 126
    log.info("started %s (pid %d)", framework.command, process.pid)
    with contextlib.suppress(OSError, psutil.Error):  # so that killing this learner kills the program too
        (workdir / PROGRAM_FILE).write_text(f"{process.pid} {psutil.Process(process.pid).create_time()!r}")
    patterns = {name: re.compile(p) for name, p in (metrics.regex or {}).items()} if metrics else {}
    pump = threading.Thread(target=_pump, args=(process, patterns, learner), daemon=True)
    pump.start()
    tail = _JsonlTail(jsonl, learner) if jsonl is not None else None
    halted = False
    while process.poll() is None:
        if tail is not None:
            tail.read()
        if not halted and learner.halt.wait(learner.spec.report_interval_s):
            halted = True
            log.info("halt: SIGTERM to the program's process group")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    pump.join(10)
    if tail is not None:
        tail.read()
    code = process.returncode if process.returncode >= 0 else 128 - process.returncode
    log.info("the program exited with code %d", code)
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        learner.storage.put_file(f"{layout.RESULTS_PREFIX}/{path.relative_to(results).as_posix()}", path)
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    if files:
        key = f"{layout.attempt_prefix(spec.attempt)}/files"
        for path in files:
            learner.storage.put_file(f"{key}/{path.relative_to(checkpoint).as_posix()}", path)
        epochs = tail.last_epoch if tail is not None else 0
        learner.commit(key, epochs, None, kind="folder")
    if halted and code != 0:
        return EXIT_HALTED
    return code


def _environment(learner: LearnerContext, results: Path, checkpoint: Path, jsonl: Path | None) -> dict[str, str]:
    spec, manifest = learner.spec, learner.manifest
    env = {"LABSWARM_JOB_ID": spec.job_id, "LABSWARM_ATTEMPT": str(spec.attempt), "LABSWARM_RANK": str(spec.rank),
           "LABSWARM_WORLD_SIZE": str(spec.world_size), "LABSWARM_RESULTS_DIR": str(results),
           "LABSWARM_CHECKPOINT_DIR": str(checkpoint)}
    if spec.master_addr:
        env["MASTER_ADDR"] = spec.master_addr
        env["MASTER_PORT"] = str(spec.master_port or 29500)
    if manifest.data_store is not None:
        env["LABSWARM_DATA_STORE"] = manifest.data_store.model_dump_json()
        path = getattr(manifest.data_store, "path", None)
        if path is not None:
            prefix = manifest.data_store.prefix
            env["LABSWARM_DATA_DIR"] = str(Path(path) / prefix if prefix else Path(path))
    if jsonl is not None:
        env["LABSWARM_METRICS_FILE"] = str(jsonl)
    return env


def _pump(process: subprocess.Popen, patterns: dict[str, re.Pattern[str]], learner: LearnerContext) -> None:
    """The program's output into the learner's (captured) stdout, line by line; regex metrics on the way."""
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        sys.stdout.write(line + "\n")
        record = {}
        for name, pattern in patterns.items():
            match = pattern.search(line)
            if match is None:
                continue
            text = match.group("value") if "value" in pattern.groupindex else match.group(1)
            try:
                record[name] = float(text)
            except (TypeError, ValueError):
                continue
        if record:
            if "epoch" in record:
                record["epoch"] = int(record["epoch"])
            learner.reporter.metric(record, key=_key(record))
    sys.stdout.flush()


class _JsonlTail:
    """Reads the records appended to a JSON-lines file (complete lines only) and reports them."""

    def __init__(self, path: Path, learner: LearnerContext) -> None:
        self.path = path
        self.learner = learner
        self.offset = 0
        self.last_epoch = 0

    def read(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                log.warning("metrics file %s: not a JSON line: %.200s", self.path.name, line)
                continue
            if not isinstance(record, dict):
                continue
            if isinstance(record.get("epoch"), int):
                self.last_epoch = max(self.last_epoch, record["epoch"])
            self.learner.reporter.metric(record, key=_key(record))


def _key(record: dict[str, Any]) -> str | None:
    """``epoch:N`` for a record of an epoch (kept once per job), else ``None``."""
    epoch = record.get("epoch")
    return f"epoch:{epoch}" if isinstance(epoch, int) else None


def _download(storage: Storage, prefix: str, folder: Path) -> None:
    """Every object under ``prefix`` into ``folder``, keeping the relative paths."""
    for key in storage.list(prefix):
        storage.get_file(key, folder / key[len(prefix) + 1:])
