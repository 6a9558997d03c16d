"""The learner as a real process reporting over real HTTP: it trains and stores the model, it halts on SIGTERM
with a committed mid-epoch checkpoint that the next attempt continues, and a ``command`` learner passes its
program's exit code, metrics (JSON lines or regular expressions) and output on."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jobs.receiver import receiver
from jobs.tiny import learner_spec, start_learner, tiny_manifest
from labswarm.jobs.learner.entry import EXIT_HALTED
from labswarm.jobs.spec import layout
from labswarm.train.trainer import load_model


def _store(tmp_path: Path):
    return layout.job_storage({"name": "local", "path": str(tmp_path / "results")}, "job1")


def _children_until_exit(process: subprocess.Popen, timeout: float) -> list[list[str]]:
    """The command lines of ``process``'s direct children seen, polled every 0.1 s until it exits (fails the test
    after ``timeout`` s)."""
    seen: list[list[str]] = []
    parent, deadline = psutil.Process(process.pid), time.monotonic() + timeout
    while process.poll() is None:
        assert time.monotonic() < deadline, "the learner did not exit"
        with contextlib.suppress(psutil.Error):
            for child in parent.children():
                with contextlib.suppress(psutil.Error):
                    if (cmd := child.cmdline()) not in seen:
                        seen.append(cmd)
        time.sleep(0.1)
    return seen


@pytest.mark.slow  # 36-66 s under load (a learner process training the tiny set)
def test_the_learner_trains_reports_and_stores_the_model(tmp_path: Path) -> None:
    manifest = tiny_manifest(tmp_path, epochs=2)
    with receiver() as r:
        process = start_learner(learner_spec(tmp_path, manifest, r.url), tmp_path / "out.log")
        children = _children_until_exit(process, 300)
        assert process.returncode == 0, (tmp_path / "out.log").read_text()
    # its prefetch producers come from a fork server, never forked from the learner (which runs other threads)
    assert any("forkserver" in " ".join(cmd) for cmd in children), children
    assert not [cmd for cmd in children if cmd[1:] == process.args[1:]], children  # a forked child's argv
    metrics = r.kinds("metric")
    assert [m["epoch"] for m in metrics] == [1, 2]
    assert [p["phase"] for p in r.kinds("phase")] == ["training", "storing"]
    # progress within each epoch: the totals predicted before the first step are the epoch's real ones, and
    # each epoch's last progress event (bar full) comes right before its metrics record
    kinds = [e["kind"] for _a, _r, e in r.events if e["kind"] in ("progress", "metric")]
    progress = r.kinds("progress")
    last = [p for p, after in zip(progress, [*progress[1:], None], strict=True)
            if after is None or after["epoch"] != p["epoch"]]
    assert [p["epoch"] for p in last] == [1, 2] and all(p["epochs"] == 2 for p in progress)
    assert [kinds[i - 1] for i, kind in enumerate(kinds) if kind == "metric"] == ["progress", "progress"]
    for p, m in zip(last, metrics, strict=True):
        assert p["step"] == p["steps"] and p["samples"] == p["samples_total"] == m["samples"]
        assert p["loss"] == m["train_loss"]
    assert all(p["steps"] == last[0]["steps"] and p["samples_total"] == metrics[0]["samples"] for p in progress)
    assert all(p["samples"] <= p["samples_total"] and p["loss"] > 0 for p in progress)
    lines = r.lines()
    assert any("learner 0/1 of job job1, attempt 1" in line for line in lines)
    # its training split read as `labswarm train` and the distributed learners read it (issue 24)
    assert any("training samples" in line and "in memory" in line for line in lines), lines
    assert lines[-1].endswith("learner exits with code 0")  # every line, the last included, reached the manager
    store = _store(tmp_path)
    _model, meta = load_model(store.get_file(layout.MODEL_KEY, tmp_path / "model.pt"))
    assert meta["metrics"]["val_accuracy"] == metrics[-1]["val_accuracy"]
    pointer = layout.latest_checkpoint(store)
    assert pointer["key"] == "checkpoints/attempt-1/epoch-0002.pt" and pointer["epoch"] == 2
    assert store.list("checkpoints") == ["checkpoints/attempt-1/epoch-0002.pt", "checkpoints/latest.json"]
    assert [json.loads(x)["epoch"] for x in store.get_bytes(layout.METRICS_KEY).splitlines()] == [1, 2]
    log = store.get_bytes(layout.log_key(1, 0)).decode()
    assert "learner exits with code 0" in log and "model stored" in log


@pytest.mark.slow  # 36-66 s under load (a learner process training the tiny set)
def test_sigterm_halts_with_a_checkpoint_and_the_next_attempt_continues_it(tmp_path: Path) -> None:
    manifest = tiny_manifest(tmp_path, epochs=3)
    store = _store(tmp_path)
    with receiver() as r:
        process = start_learner(learner_spec(tmp_path, manifest, r.url), tmp_path / "out.log")
        r.wait_for(lambda: (r.progress.get((1, 0)) or {}).get("epoch") == 2)  # in the middle of epoch 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == EXIT_HALTED, (tmp_path / "out.log").read_text()
        pointer = layout.latest_checkpoint(store)
        # mid-epoch: in epoch 2, or in epoch 3 when the signal came during epoch 2's validation
        assert pointer["attempt"] == 1 and pointer["epoch"] in (1, 2) and pointer["step"] >= 1
        done = pointer["epoch"]
        assert store.exists(pointer["key"]) and not store.exists(layout.MODEL_KEY)
        assert r.kinds("checkpoint")[-1] == pointer

        second = start_learner(learner_spec(tmp_path, manifest, r.url, attempt=2, checkpoint=pointer),
                               tmp_path / "out.log")
        assert second.wait(300) == 0, (tmp_path / "out.log").read_text()
    # the epochs done were reported by both attempts and kept once; the others come from the second attempt only
    assert [m["epoch"] for m in r.kinds("metric")] == [1, 2, 3]
    assert [m["epoch"] for m in r.kinds("metric", attempt=2)] == list(range(done + 1, 4))
    assert any(f"from checkpoint {pointer['key']}" in line for line in r.lines(attempt=2))
    assert any(f"resuming three in epoch {done + 1} after step" in line for line in r.lines(attempt=2))
    assert layout.latest_checkpoint(store)["key"] == "checkpoints/attempt-2/epoch-0003.pt"
    load_model(store.get_file(layout.MODEL_KEY, tmp_path / "model.pt"))


_PROGRAM = """
import json, os, sys
print("data", os.environ.get("LABSWARM_DATA_DIR"), "attempt", os.environ["LABSWARM_ATTEMPT"])
with open(os.environ["LABSWARM_METRICS_FILE"], "a") as f:
    for epoch in (1, 2):
        f.write(json.dumps({"epoch": epoch, "loss": 1.0 / epoch}) + "\\n")
        print(f"epoch {epoch} loss={1.0 / epoch}", flush=True)
open(os.path.join(os.environ["LABSWARM_RESULTS_DIR"], "out.txt"), "w").write("result")
print("giving up", file=sys.stderr)
sys.exit(3)
"""


def test_a_command_learner_passes_exit_code_metrics_and_output_on(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    manifest = tiny_manifest(tmp_path, framework={
        "name": "command", "command": [sys.executable, "-c", _PROGRAM], "metrics": {"jsonl": "metrics.jsonl"}},
        data_store={"name": "local", "path": str(tmp_path / "data")})
    with receiver() as r:
        process = start_learner(learner_spec(tmp_path, manifest, r.url), tmp_path / "out.log")
        assert process.wait(120) == 3, (tmp_path / "out.log").read_text()
    assert r.kinds("metric") == [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]
    lines = r.lines()
    assert f"data {tmp_path / 'data'} attempt 1" in lines and "giving up" in lines
    assert lines[-1].endswith("learner exits with code 3")
    assert _store(tmp_path).get_bytes("results/out.txt") == b"result"


_HALTABLE = """
import os, signal, sys, time
def halt(*_):
    open(os.path.join(os.environ["LABSWARM_CHECKPOINT_DIR"], "state.txt"), "w").write("step 7")
    print("checkpointed", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, halt)
print("resumed from", open(os.path.join(os.environ["LABSWARM_CHECKPOINT_DIR"], "state.txt")).read()
      if os.path.exists(os.path.join(os.environ["LABSWARM_CHECKPOINT_DIR"], "state.txt")) else "nothing",
      flush=True)
if os.environ["LABSWARM_ATTEMPT"] == "2":
    sys.exit(0)
print("step=1", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_command_learner_halts_on_the_manager_s_answer_and_resumes_from_its_folder(tmp_path: Path) -> None:
    manifest = tiny_manifest(tmp_path, framework={
        "name": "command", "command": [sys.executable, "-c", _HALTABLE],
        "metrics": {"regex": {"step": r"step=(\d+)"}}})
    with receiver() as r:
        process = start_learner(learner_spec(tmp_path, manifest, r.url), tmp_path / "out.log")
        r.wait_for(lambda: r.kinds("metric"))
        r.halt = True
        assert process.wait(120) == EXIT_HALTED, (tmp_path / "out.log").read_text()
        pointer = layout.latest_checkpoint(_store(tmp_path))
        assert pointer["kind"] == "folder" and pointer["key"] == "checkpoints/attempt-1/files"
        r.halt = False
        second = start_learner(learner_spec(tmp_path, manifest, r.url, attempt=2, checkpoint=pointer),
                               tmp_path / "out.log")
        assert second.wait(120) == 0, (tmp_path / "out.log").read_text()
    assert r.kinds("metric") == [{"step": 1.0}]
    assert "checkpointed" in r.lines(attempt=1)
    assert "resumed from step 7" in r.lines(attempt=2)
