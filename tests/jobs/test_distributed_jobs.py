"""Distributed training jobs (``learners: 2`` with a distributed framework): real manager, real learner processes,
real parameter-server shards, the tiny three-class experiment. Kill -9 a learner mid-job under a synchronous and an
asynchronous framework: the job completes and its stored chunk record shows every sample trained exactly once per
pass (the killed process's chunks included); delete leaves no process and no coordinator port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

import psutil
import pytest
from train.three_classes import write_three_classes

from jobs.chunk_record import assert_every_sample_once_per_pass
from jobs.manager import (
    Manager,
    freeze_until_rank_0_steps,
    learner_processes,
    manager,
    read_events,
    statuses,
    wait_until,
)
from jobs.tiny import tiny_manifest
from labswarm.jobs.spec.errors import EXIT_HALTED, EXIT_PLATFORM
from labswarm.train.distributed import record
from labswarm.train.trainer import load_model


def _distributed(tmp_path: Path, framework: dict, *, epochs: int = 3, **overrides) -> dict:
    manifest = tiny_manifest(tmp_path, epochs=epochs, learners=2, framework=framework, **overrides)
    manifest["training"]["threads"] = 1  # 2 learners on 2 shared cores
    return manifest


def _metrics(m: Manager, job_id: str) -> list[dict]:
    response = m.http.get(f"/v1/jobs/{job_id}/metrics")
    assert response.status_code == 200, response.text
    body = response.json()
    return body["metrics"] if isinstance(body, dict) else body


def _model(m: Manager, job_id: str, tmp_path: Path) -> Path:
    response = m.http.get(f"/v1/jobs/{job_id}/model")
    assert response.status_code == 200, response.text
    path = tmp_path / f"{job_id}.pt"
    path.write_bytes(response.content)
    return path


def _results(tmp_path: Path, job_id: str) -> Path:
    """The job's results store (the tiny manifest's local one)."""
    return tmp_path / "results" / "jobs" / job_id


def _pid(m: Manager, job_id: str, rank: int) -> int:
    """The pid of the current attempt's learner ``rank`` (the learner itself, not one of its data loaders)."""
    return next(lr["pid"] for lr in m.show(job_id)["attempts"][-1]["learners"] if lr["rank"] == rank)


def _ps_processes(job_id: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "labswarm.train.distributed.ps" in cmdline and any(f"/{job_id}/ps" in part for part in cmdline):
            found.append(process)
    return found


def _running_shard(m: Manager, job_id: str, tmp_path: Path) -> list[psutil.Process]:
    """The job's one running shard process, waited for (it may be between a death and its revival, or its command
    line not yet readable); on a timeout, what explains it: the job, the shards' outputs and every shard-like
    process of the machine."""
    try:
        return wait_until(lambda: [p for p in _ps_processes(job_id) if p.is_running()], 120, "the job's shard process")
    except TimeoutError as exc:
        outputs = {str(out.relative_to(tmp_path)): out.read_text(errors="replace")[-3000:]
                   for out in sorted(tmp_path.glob("home/**/shard-*.out"))}
        others = [(p.pid, p.info["cmdline"]) for p in psutil.process_iter(["cmdline"])
                  if any("distributed.ps" in part for part in p.info["cmdline"] or [])]
        raise AssertionError(f"{exc}\njob: {m.show(job_id)}\nshard outputs: {outputs}\nshard processes: {others}") \
            from exc


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _epoch_ended(stream_event: dict) -> bool:
    return stream_event["event"] == "metric" and stream_event["data"].get("epoch") == 1


def _explained(shown: dict, stream: list[dict]) -> str:
    """Each attempt's end (exit code, error code, reason, every learner's exit code and kill) and the last log lines
    of the stream: what a failed assertion about the attempts shows."""
    ended = [{k: a[k] for k in ("number", "exit_code", "error_code", "reason")}
             | {"learners": [(lr["rank"], lr["exit_code"], lr["killed"]) for lr in a["learners"]]}
             for a in shown["attempts"]]
    lines = [f"{e['data'].get('attempt')}/{e['data'].get('rank')}: {e['data']['line']}" for e in stream
             if e["event"] == "log"]
    return f"attempts {ended}; restarts {shown['restarts']}; last log lines:\n" + "\n".join(lines[-40:])


def kill_learner_after_first_checkpoint(m: Manager, job_id: str, rank: int = 1) -> tuple[list[dict], dict, list[dict]]:
    """Once epoch 1 ended and a checkpoint is committed, SIGKILL learner ``rank`` of the current attempt, then read
    the event stream to its end: ``(events, the job as shown, its metrics)``."""
    read_events(m.http, job_id, until=_epoch_ended)
    wait_until(lambda: m.show(job_id)["checkpoint"], 60, "the first checkpoint")
    os.kill(_pid(m, job_id, rank), signal.SIGKILL)
    stream = read_events(m.http, job_id)
    return stream, m.show(job_id), _metrics(m, job_id)


@pytest.mark.slow
def test_allreduce_with_two_learners_completes_and_its_model_loads(tmp_path: Path) -> None:
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(_distributed(tmp_path, {"name": "allreduce"}, epochs=2))
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        metrics = _metrics(m, job["id"])
        model, meta = load_model(_model(m, job["id"], tmp_path))
    assert statuses(stream)[-1] == "completed", _explained(shown, stream)
    assert len(shown["attempts"]) == 1, _explained(shown, stream)  # a healthy job needs no restart
    [attempt] = shown["attempts"]
    assert sorted(lr["rank"] for lr in attempt["learners"]) == [0, 1]
    assert all(lr["exit_code"] == 0 for lr in attempt["learners"])
    started = next(e for e in stream if e["event"] == "attempt" and e["data"]["event"] == "started")
    assert started["data"]["coordinator_port"] > 0
    assert [r["epoch"] for r in metrics] == [1, 2]
    assert all(r["world_size"] == 2 and "val_accuracy" in r for r in metrics)  # rank 0's records only
    assert meta["classes"] and model is not None
    logs = {e["data"].get("rank") for e in stream if e["event"] == "log"}
    assert {0, 1} <= logs  # every rank's log reaches the stream


def test_manifest_errors_name_the_field(tmp_path: Path) -> None:
    with manager(tmp_path) as m:
        for change, path in (({"framework": {"name": "allreduse"}}, "framework.name"),
                             ({"framework": {"name": "easgd", "tau": 0}}, "framework.tau"),
                             ({"framework": {"name": "allreduce", "timeout_s": 0}}, "framework.timeout_s"),
                             ({"framework": {"name": "allreduce"}, "ps_shards": 1}, "ps_shards"),
                             ({"framework": {"name": "downpour"}, "learners": 1}, "learners"),
                             # batch: global (the default) cannot split the tiny experiment's batch of 4 in 3
                             ({"framework": {"name": "allreduce"}, "learners": 3}, "framework.batch"),
                             ({"framework": {"name": "sandblaster"}, "learners": 3, "ps_shards": 1},
                              "framework.batch"),
                             ({"framework": {"name": "labswarm"}}, "learners")):
            manifest = {**_distributed(tmp_path, {"name": "allreduce"}), **change}
            response = m.http.post("/v1/jobs", json=manifest)
            assert response.status_code == 422, (change, response.text)
            assert path in response.text, (change, response.text)


@pytest.mark.slow
def test_downpour_learner_killed_restarts_alone_and_the_job_completes(tmp_path: Path) -> None:
    manifest = _distributed(tmp_path, {"name": "downpour"}, epochs=3, ps_shards=1)
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        # Rank 1 trains the tiny set's 3 passes in ~0.2 s and never waits for rank 0: killed at a log line of its
        # training, it had sometimes exited 0 already (the kill then hit nothing). So it is frozen while it starts
        # (it cannot have exited: torch's import alone takes seconds) and killed once rank 0 is mid-pass, in the
        # attempt running then (on a loaded machine an earlier one may have failed before its first step).
        rank = 1
        victim, number = freeze_until_rank_0_steps(m, job["id"], rank)
        before = m.show(job["id"])
        assert len(_ps_processes(job["id"])) == 1
        os.kill(victim, signal.SIGKILL)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        metrics = _metrics(m, job["id"])
    assert statuses(stream)[-1] == "completed", _explained(shown, stream)
    attempt = shown["attempts"][-1]  # the same attempt: only the dead learner restarted
    assert attempt["number"] == number == len(before["attempts"]), _explained(shown, stream)
    assert len(attempt["learner_restarts"]) == 1, attempt["learner_restarts"]
    [restart] = attempt["learner_restarts"]
    assert restart["rank"] == rank and restart["previous"]["pid"] == victim
    assert restart["previous"]["exit_code"] == -signal.SIGKILL
    assert shown["restarts"] == {"user": 0, "platform": before["restarts"]["platform"] + 1}, _explained(shown, stream)
    assert [r["epoch"] for r in metrics] == [1, 2, 3]
    assert_every_sample_once_per_pass(_results(tmp_path, job["id"]), shown, manifest, 3)  # the killed one's too


@pytest.mark.slow
def test_a_downpour_learner_killed_in_its_first_pass_keeps_its_chunks_in_the_stored_record(tmp_path: Path) -> None:
    """Issue 22's held-out case: rank 1 killed -9 after it trained chunks of the first pass, before any checkpoint.
    Its chunks are done in the cursor; they must be in the stored record (its lines were buffered and its
    restarted successor wiped its run folder: 8 of 192 samples were absent from pass 0)."""
    write_three_classes(tmp_path / "data", per_class=16)
    manifest = _distributed(tmp_path, {"name": "downpour"}, epochs=2, ps_shards=1)
    manifest["experiment"]["pipeline"][3]["size"] = 1  # 72 training samples a pass, one a step: ~36 steps a rank
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        # rank 1 of the attempt whose rank 1 stepped (on a loaded machine an earlier attempt may have failed)
        stepped = read_events(m.http, job["id"], until=lambda e: e["event"] == "log" and e["data"].get("rank") == 1
                              and "first step" in e["data"]["line"])[-1]
        number = stepped["data"]["attempt"]
        before = m.show(job["id"])
        [running] = [a for a in before["attempts"] if a["number"] == number]
        victim = next(lr["pid"] for lr in running["learners"] if lr["rank"] == 1)
        os.kill(victim, signal.SIGKILL)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
    assert statuses(stream)[-1] == "completed", _explained(shown, stream)
    attempt = shown["attempts"][-1]
    assert attempt["number"] == number == len(before["attempts"]), _explained(shown, stream)
    assert [r["previous"]["pid"] for r in attempt["learner_restarts"]] == [victim], (
        _explained(shown, stream), attempt["learner_restarts"])
    results = _results(tmp_path, job["id"])
    assert_every_sample_once_per_pass(results, shown, manifest, 2)
    lines = record.read(results.glob(f"logs/attempt-{number}/chunks-1.jsonl"))
    assert any(c["owner"].split(":")[2] == str(victim) for c in lines), "the premise: the killed process trained chunks"


@pytest.mark.slow
def test_allreduce_learner_killed_restarts_both_from_the_checkpoint(tmp_path: Path) -> None:
    manifest = _distributed(tmp_path, {"name": "allreduce"}, epochs=3)
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        stream, shown, metrics = kill_learner_after_first_checkpoint(m, job["id"])
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    first, second = shown["attempts"]
    assert first["error_code"] is not None and second["exit_code"] == 0
    assert second["checkpoint_in"] is not None and second["checkpoint_in"]["epoch"] >= 1
    assert sorted(lr["rank"] for lr in second["learners"]) == [0, 1]
    assert [r["epoch"] for r in metrics] == [1, 2, 3]  # every epoch once
    assert_every_sample_once_per_pass(_results(tmp_path, job["id"]), shown, manifest, 3)


@pytest.mark.slow
def test_a_learner_hung_inside_a_collective_fails_the_step_and_the_learners_restart(tmp_path: Path) -> None:
    """Rank 1 frozen (SIGSTOP) mid-job: rank 0's next all-reduce times out after the framework's ``timeout_s`` (10 s:
    it bounds every wait for a peer after the first join, which JOIN_TIMEOUT_S bounds; not shorter on 2 loaded cores)
    and fails its learner; the lifecycle kills the frozen peer and both restart from the checkpoint. The watchdog
    (60 s without a report) is not what finds it: rank 1 is killed as a peer, not as hung."""
    manifest = _distributed(tmp_path, {"name": "allreduce", "timeout_s": 10}, epochs=4)
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        read_events(m.http, job["id"], until=_epoch_ended)
        wait_until(lambda: m.show(job["id"])["checkpoint"], 60, "the first checkpoint")
        victim = _pid(m, job["id"], 1)
        os.kill(victim, signal.SIGSTOP)
        stream = read_events(m.http, job["id"])
        shown = m.show(job["id"])
        metrics = _metrics(m, job["id"])
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    first, second = shown["attempts"]
    hung = {lr["rank"]: lr for lr in first["learners"]}
    assert hung[1]["pid"] == victim and hung[1]["killed"] == "peer", hung
    assert hung[0]["exit_code"] == EXIT_PLATFORM and hung[0]["killed"] is None, hung
    rank0 = [e["data"]["line"] for e in stream if e["event"] == "log" and e["data"].get("rank") == 0
             and e["data"].get("attempt") == 1]
    # gloo: "Timed out waiting 10000ms for recv operation to complete": the manifest's timeout, not the default 30 s;
    # when the op that timed out is not the one that raises (DDP's buffer broadcast in the forward, an async work),
    # the raised one reads "Application timeout caused pair closure" (gloo closes the pair), without the figure
    timeouts = [line.lower() for line in rank0 if "timed out waiting" in line.lower()
                or "application timeout caused pair closure" in line.lower()]
    assert timeouts, rank0[-5:]
    assert all("10000ms" in line for line in timeouts if "timed out waiting" in line), timeouts
    assert second["exit_code"] == 0 and second["checkpoint_in"]["epoch"] >= 1
    assert [r["epoch"] for r in metrics] == [1, 2, 3, 4]  # every epoch once
    assert_every_sample_once_per_pass(_results(tmp_path, job["id"]), shown, manifest, 4)


@pytest.mark.slow
def test_delete_leaves_no_learner_shard_or_coordinator(tmp_path: Path) -> None:
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(_distributed(tmp_path, {"name": "downpour"}, epochs=20))
        stream = read_events(m.http, job["id"], until=lambda e: e["event"] == "status"
                             and e["data"]["status"] == "running")
        started = next(e for e in stream if e["event"] == "attempt" and e["data"]["event"] == "started")
        port = started["data"]["coordinator_port"]
        pids = started["data"]["pids"] + started["data"]["ps_pids"]
        assert _listening(port) and len(pids) == 3
        assert m.http.delete(f"/v1/jobs/{job['id']}").status_code in (200, 204)
        gone = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert gone == []
        assert learner_processes(job["id"]) == [] and _ps_processes(job["id"]) == []
        wait_until(lambda: not _listening(port), 60, "the coordinator's port closed")


@pytest.mark.slow
def test_halt_stops_both_allreduce_learners_at_the_same_step_and_resume_completes(tmp_path: Path) -> None:
    """A halt after the first epoch's metrics: the lockstep learners agree on it at the same step boundary (mid-epoch,
    or the epoch's end when it comes after the last step), both exit halted with a checkpoint, and the resume
    trains the epochs left, each once."""
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(_distributed(tmp_path, {"name": "allreduce"}, epochs=3))
        read_events(m.http, job["id"], until=_epoch_ended)
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"}).status_code == 200
        halted = read_events(m.http, job["id"], until=lambda e: e["event"] == "status"
                             and e["data"]["status"] in ("halted", "failed", "completed"))
        shown = m.show(job["id"])
        assert statuses(halted)[-1] == "halted", shown.get("log_tail")
        assert shown["checkpoint"]["epoch"] >= 1
        codes = [lr["exit_code"] for lr in shown["attempts"][0]["learners"]]
        assert codes == [EXIT_HALTED, EXIT_HALTED], codes  # both stopped at the same step, not killed
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "resume"}).status_code == 200
        stream = read_events(m.http, job["id"], last_event_id=halted[-1]["id"])
        metrics = _metrics(m, job["id"])
    assert statuses(stream)[-1] == "completed"
    assert [r["epoch"] for r in metrics] == [1, 2, 3]


@pytest.mark.slow
def test_a_killed_shard_restarts_from_its_checkpoint_and_the_job_completes(tmp_path: Path) -> None:
    """The job's shard killed -9 while its learners train: the manager revives it on its port (a platform restart
    within the attempt), the learners reconnect, the job completes with every sample once a pass. The learners are
    frozen (SIGSTOP) from the kill to the revival's line, so that the kill lands mid-job however the machine's load
    spreads their steps: a downpour learner can train the whole job before its peer's first step (a loaded CI run
    waited on rank 0's first step, which came as the job ended)."""
    manifest = _distributed(tmp_path, {"name": "downpour"}, epochs=3)
    revived = "shard 0 exited -9: restarted from its checkpoint"
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        stream = read_events(m.http, job["id"], until=lambda e: e["event"] == "log"
                             and e["data"].get("source") != "launcher" and "first step" in e["data"]["line"])
        before = m.show(job["id"])
        learners = learner_processes(job["id"])  # each learner and its data loaders
        for process in learners:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.suspend()
        try:
            [shard] = _running_shard(m, job["id"], tmp_path)
            shard.send_signal(signal.SIGKILL)
            stream += read_events(m.http, job["id"], last_event_id=stream[-1]["id"], until=lambda e: e["event"] == "log"
                                  and revived in e["data"]["line"], timeout=120)
        finally:
            for process in learners:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.resume()
        stream += read_events(m.http, job["id"], last_event_id=stream[-1]["id"])
        shown = m.show(job["id"])
        metrics = _metrics(m, job["id"])
    assert statuses(stream)[-1] == "completed", _explained(shown, stream)
    lines = [e["data"]["line"] for e in stream if e["event"] == "log" and e["data"].get("source") == "launcher"]
    assert any("shard 0 exited -9: restarted from its checkpoint" in line for line in lines), lines
    # the revived shard is a platform restart within the attempt, not a new attempt
    assert len(shown["attempts"]) == len(before["attempts"]), _explained(shown, stream)
    assert shown["restarts"] == {"user": 0, "platform": before["restarts"]["platform"] + 1}, _explained(shown, stream)
    assert [r["epoch"] for r in metrics] == [1, 2, 3]
    assert_every_sample_once_per_pass(_results(tmp_path, job["id"]), shown, manifest, 3)
