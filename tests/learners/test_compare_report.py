"""The comparison's arithmetic without jobs: per-rank records from a job's event stream, a run's row, the
scaling lines, and the manifests ``labswarm compare`` submits."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from train.three_classes import training_experiment

from labswarm.compare.report import CompareError, rank_records, scaling, summarize
from labswarm.compare.run import job_manifest, parse_frameworks, parse_learners
from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError

T0 = 1_700_000_000.0


def _event(kind: str, at: float, **data) -> dict:
    stamp = datetime.fromtimestamp(T0 + at, UTC).isoformat()
    return {"id": 0, "event": kind, "data": {**data, "stamp": stamp}}


def _stream() -> list[dict]:
    """Two ranks, two epochs: rank 1 reports progress (the last of each epoch is its end), rank 0 metrics."""
    return [
        _event("status", 0.0, status="pending"),
        _event("status", 2.0, status="running"),
        _event("progress", 5.0, rank=1, epoch=1, samples=8, samples_per_s=8.0, loss=2.0),  # mid-epoch
        _event("progress", 6.0, rank=1, epoch=1, samples=20, samples_per_s=10.0, loss=1.0,
               comm={"bytes_sent": 100, "staleness_p50": 1, "staleness_p99": 3}),
        _event("metric", 7.0, rank=0, epoch=1, samples=16, epoch_s=4.0, data_wait_s=0.0, train_loss=0.5,
               val_accuracy=0.6, val_loss=0.9, comm={"bytes_sent": 80, "staleness_p50": 0, "staleness_p99": 1}),
        # epoch 2: rank 1 took no chunk (no progress of its own), rank 0 all
        _event("metric", 12.0, rank=0, epoch=2, samples=36, epoch_s=3.0, data_wait_s=0.0, train_loss=0.25,
               val_accuracy=0.9, val_loss=0.3, comm={"bytes_sent": 160, "staleness_p50": 0, "staleness_p99": 1}),
        _event("status", 13.0, status="completed"),
    ]


def test_rank_records_take_rank_0_from_metrics_and_the_others_from_their_last_progress_of_each_epoch() -> None:
    r0, r1 = rank_records(_stream(), 2)
    assert [(r["epoch"], r["elapsed_s"], r["samples"]) for r in r0] == [(1, 5.0, 16), (2, 10.0, 36)]
    assert r0[1]["val_accuracy"] == 0.9 and r0[1]["comm"]["bytes_sent"] == 160
    assert r1[0] == {"epoch": 1, "samples": 20, "elapsed_s": 4.0, "epoch_s": 2.0, "train_loss": 1.0,
                     "comm": {"bytes_sent": 100, "staleness_p50": 1, "staleness_p99": 3}}
    assert r1[1]["samples"] == 0 and r1[1]["elapsed_s"] == 10.0  # no step in epoch 2: rank 0's time
    assert "val_accuracy" not in r1[0]  # rank 0 alone validates
    with pytest.raises(CompareError):
        rank_records([_event("status", 0.0, status="running")], 2)


def test_a_row_sums_the_ranks_samples_and_divides_by_the_slowest_ranks_compute_seconds() -> None:
    row = summarize("downpour", rank_records(_stream(), 2), target=0.8, params={"name": "downpour", "n_push": 2})
    assert [e["samples"] for e in row["epochs"]] == [36, 72]  # cumulative, all ranks
    assert [e["elapsed_s"] for e in row["epochs"]] == [5.0, 10.0]  # the slowest rank's
    assert row["epochs"][0]["train_loss"] == pytest.approx((0.5 * 16 + 1.0 * 20) / 36)  # sample-weighted
    assert row["samples_per_s"] == pytest.approx(72 / 7.0)  # rank 0: 4 + 3 s of compute, rank 1: 2 s
    assert row["time_to_target_s"] == 10.0 and row["final_val_accuracy"] == 0.9
    assert row["bytes_sent_per_learner"] == (160 + 100) / 2
    assert (row["staleness_p50"], row["staleness_p99"]) == (1, 3)  # the worst rank's
    assert row["label"] == "downpour(n_push=2) ×2" and row["params"] == {"n_push": 2}


def test_time_waiting_for_data_is_not_compute_and_one_learner_sends_nothing() -> None:
    records = [{"epoch": 1, "elapsed_s": 9.0, "samples": 40, "epoch_s": 5.0, "data_wait_s": 1.0,
                "train_loss": 0.7, "val_accuracy": 0.5, "val_loss": 1.0}]
    row = summarize("labswarm", [records], target=0.8)
    assert row["samples_per_s"] == pytest.approx(10.0) and row["data_wait_s"] == 1.0
    assert row["bytes_sent_per_learner"] == 0 and row["time_to_target_s"] is None
    assert "staleness_p50" not in row and row["label"] == "labswarm ×1"


def test_every_frameworks_scaling_line_starts_at_the_one_learner_run() -> None:
    rows = [{"framework": "labswarm", "label": "labswarm ×1", "learners": 1, "samples_per_s": 50.0},
            {"framework": "allreduce", "label": "allreduce ×2", "learners": 2, "samples_per_s": 90.0},
            {"framework": "downpour", "label": "downpour ×2", "learners": 2, "samples_per_s": 70.0},
            {"framework": "allreduce", "label": "allreduce ×3", "learners": 3, "samples_per_s": 100.0}]
    assert scaling(rows) == {"allreduce": [(1, 50.0), (2, 90.0), (3, 100.0)], "downpour": [(1, 50.0), (2, 70.0)]}


def test_the_jobs_share_one_workload_and_one_learner_is_the_single_process_trainer(tmp_path: Path) -> None:
    workload = training_experiment(tmp_path, tmp_path / "store")
    single = job_manifest(workload, {"name": "downpour"}, 1, tmp_path / "results", epochs=2)
    ps = job_manifest(workload, {"name": "downpour", "n_push": 2}, 2, tmp_path / "results", epochs=2, ps_shards=2)
    ar = job_manifest(workload, {"name": "allreduce"}, 2, tmp_path / "results", epochs=2)
    assert single["framework"] == {"name": "labswarm"} and single["learners"] == 1 and "ps_shards" not in single
    assert ps["ps_shards"] == 2 and ps["framework"] == {"name": "downpour", "n_push": 2} and "ps_shards" not in ar
    assert ps["experiment"] == ar["experiment"] == workload
    # one learner: the pipeline in the trainer's process (its data work is data wait), nothing else changed
    assert single["experiment"]["pipeline"][-1] == {**workload["pipeline"][-1], "producers": 0}
    assert {**single["experiment"], "pipeline": workload["pipeline"]} == workload
    assert workload["pipeline"][-1]["producers"] == 2  # the caller's mapping is left alone
    for manifest in (single, ps, ar):
        assert manifest["training"] == {"threads": 1, "epochs": 2}
        parse_manifest(manifest)  # the manager takes it
    seeded = job_manifest(workload, {"name": "allreduce"}, 2, tmp_path / "results", epochs=2, seed=11)  # a round's
    assert parse_manifest(seeded).training_config().seed == 11 and seeded["experiment"] == workload  # own order
    with pytest.raises(ConfigError, match="framework"):
        job_manifest(workload, None, 2, tmp_path)


def test_command_line_specs() -> None:
    assert parse_frameworks(["allreduce", "model_averaging:period=8,warmup_steps=0"]) == [
        {"name": "allreduce"}, {"name": "model_averaging", "period": 8, "warmup_steps": 0}]
    assert parse_learners("2, 1,2") == [1, 2] and parse_learners([3]) == [3]
    for bad in ([], ["allreduse"], ["easgd:tau"], ["allreduce", "allreduce"]):
        with pytest.raises(ConfigError, match="framework"):
            parse_frameworks(bad)
    for text in ("", "1,x", "0"):
        with pytest.raises(ConfigError, match="learners"):
            parse_learners(text)


def test_a_topology_is_compared_with_its_own_learners_and_a_bad_one_names_its_field(tmp_path: Path) -> None:
    """Issue 23 item 4: ``topology:...`` resolves to the framework that runs it; its job has the topology's learners
    and shards; one no framework runs, or an invalid one, is refused naming the field under framework.topology."""
    [hybrid, timed] = parse_frameworks(["topology:worker_groups=2,workers_per_group=2,colocated=false",
                                        "topology:worker_groups=2,workers_per_group=2,colocated=false,timeout_s=300"])
    assert hybrid == {"name": "downpour", "group_size": 2,
                      "topology": {"worker_groups": 2, "workers_per_group": 2, "colocated": False}}
    assert timed == {**hybrid, "timeout_s": 300}  # a key that is no topology field is the framework's parameter
    manifest = job_manifest({"name": "x"}, hybrid, 4, tmp_path / "results", epochs=1)
    assert (manifest["framework"], manifest["ps_shards"]) == (hybrid, 1)
    assert summarize("downpour", [[{"epoch": 1, "val_accuracy": 0.5, "elapsed_s": 1.0, "samples": 4}]] * 4, 0.8,
                     params=hybrid)["label"] == "downpour(group_size=2,topology=2x2 workers/1x1 servers) ×4"
    for bad, field in (("topology:worker_groups=2,workers_per_group=2,server_groups=2,sync_period=4,colocated=false",
                        "framework.topology.server_groups"),  # separate server groups: no framework yet
                       ("topology:worker_groups=0,workers_per_group=2", "framework.topology.worker_groups")):
        with pytest.raises(ConfigError) as caught:
            parse_frameworks([bad])
        assert caught.value.errors[0][0] == field, caught.value.errors
