"""A halt of an asynchronous distributed job in the middle of a pass, and its resume: real manager, 2 ``downpour``
learner processes and 1 parameter-server shard, the tiny three-class experiment.

Asynchronous ranks stop at their own step, so rank 1's checkpoint copy is not named like rank 0's (the pointer's):
on resume it must find its own (:func:`labswarm.jobs.spec.layout.latest_rank_copy`), or its running totals restart from
zero (it used to take rank 0's)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from train.three_classes import write_three_classes

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.config.experiment import parse_experiment
from labswarm.jobs.spec.errors import EXIT_HALTED
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train import checkpoint


def _finals(stream: list[dict]) -> dict[int, dict[int, dict]]:
    """``{epoch: {rank: data}}`` of each learner's last end-of-epoch progress event (the one with ``comm``)."""
    out: dict[int, dict[int, dict]] = defaultdict(dict)
    for event in stream:
        if event["event"] == "progress" and "comm" in event["data"]:
            out[event["data"]["epoch"]][event["data"]["rank"]] = event["data"]
    return out


@pytest.mark.slow
def test_downpour_halted_mid_pass_resumes_each_rank_from_its_own_checkpoint(tmp_path: Path) -> None:
    # 64 clips a class (288 training samples) in chunks of 1: a pass of ~140 steps per learner, so the halt, sent
    # after rank 1's first step, lands inside one (with the tiny set's 36 samples in chunks of 4 it often came after;
    # with 32 clips a class a loaded CI machine let rank 1 finish its ~70 steps of the pass in the ~1 s the halt
    # takes to reach it, and it stopped at the next pass's step 0)
    write_three_classes(tmp_path / "data", per_class=64)
    manifest = tiny_manifest(tmp_path, epochs=2, learners=2, framework={"name": "downpour"}, ps_shards=1)
    manifest["training"]["threads"] = 1  # 2 learners on 2 shared cores
    manifest["experiment"]["pipeline"][3]["size"] = 1
    with manager(tmp_path, job_slots=2) as m:
        job = m.submit(manifest)
        read_events(m.http, job["id"], until=lambda e: e["event"] == "log" and e["data"].get("rank") == 1
                    and "first step" in e["data"]["line"])
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"}).status_code == 200
        halted = read_events(m.http, job["id"], until=lambda e: e["event"] == "status"
                             and e["data"]["status"] in ("halted", "failed", "completed"))
        shown = m.show(job["id"])
        assert statuses(halted)[-1] == "halted", shown.get("log_tail")
        assert [lr["exit_code"] for lr in shown["attempts"][0]["learners"]] == [EXIT_HALTED, EXIT_HALTED]
        pointer = shown["checkpoint"]
        stored = tmp_path / "results" / "jobs" / job["id"] / "checkpoints" / "attempt-1"
        [copy] = stored.glob("*.rank-1.pt")  # rank 1's own checkpoint, named by its own step
        before = checkpoint.load(copy)
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "resume"}).status_code == 200
        stream = read_events(m.http, job["id"], last_event_id=halted[-1]["id"])
        shown = m.show(job["id"])
        response = m.http.get(f"/v1/jobs/{job['id']}/metrics")
        assert response.status_code == 200, response.text
        metrics = response.json()["metrics"] if isinstance(response.json(), dict) else response.json()
    assert statuses(stream)[-1] == "completed", shown.get("log_tail")
    # the premise: rank 1 stopped inside a pass with samples of it trained
    assert before["partial"] is not None and before["partial"]["rank"] == 1 and before["partial"]["seen"] > 0
    print(f"rank 0 stopped at {pointer['key']}, rank 1 at {copy.name}")  # -s: where the two stopped

    with Pipeline(parse_experiment(manifest["experiment"]), split="train", train=False).epoch(0) as batches:
        train_ids = Counter(i for b in batches for i in b.ids)
    assert len(train_ids) == 288 and set(train_ids.values()) == {1}  # 192 sources × 2 transformations × 3/4
    logs = tmp_path / "results" / "jobs" / job["id"] / "logs"
    chunks = [{**json.loads(line), "rank": int(path.stem.removeprefix("chunks-"))}
              for path in logs.glob("attempt-*/chunks-*.jsonl") for line in path.read_text().splitlines()]
    for pass_ in range(2):  # every sample of each pass, the halted one included, trained exactly once overall
        assert Counter(i for c in chunks if c["pass"] == pass_ for i in c["ids"]) == train_ids, f"pass {pass_}"

    # rank 1's running totals went on across the halt: its framework's step count and communication totals
    final = checkpoint.load(stored.parent / "attempt-2" / "epoch-0002.rank-1.pt")["distributed"]
    mine = sum(1 for c in chunks if c["rank"] == 1)
    assert final["framework"]["steps"] == mine, (final["framework"]["steps"], mine)  # one chunk a step, both attempts
    assert final["comm"]["syncs"] > before["distributed"]["comm"]["syncs"] > 0
    assert final["comm"]["staleness"][:len(before["distributed"]["comm"]["staleness"])] == \
        before["distributed"]["comm"]["staleness"]
    # and its epoch sums: with rank 0's (the job's metrics) they add up to the pass
    rank0 = {r["epoch"]: r["samples"] for r in metrics}
    assert sorted(rank0) == [1, 2]
    for epoch, data in _finals(halted + stream).items():  # rank 1's end-of-epoch reports (epochs it stepped in)
        if 1 in data:
            assert rank0[epoch] + data[1]["samples"] == len(train_ids), (epoch, rank0[epoch], data[1]["samples"])
