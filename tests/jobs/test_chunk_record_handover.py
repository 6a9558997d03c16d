"""A distributed learner replaced in a fresh working folder (a swarm learner's new container, another node) keeps
its predecessor's stored chunk lines: :meth:`labswarm.jobs.learner.context.LearnerContext.open_chunk_record`
starts the record from the rank's stored one before the replacement's uploads replace that object; and each
incarnation's owner differs even with the same pid (:func:`labswarm.train.distributed.record.owner`)."""

from __future__ import annotations

from pathlib import Path

from jobs.tiny import tiny_manifest
from labswarm.config.manifest import parse_manifest
from labswarm.jobs.learner.context import LearnerContext, LearnerSpec
from labswarm.train.distributed.record import ChunkRecord, owner, read


def learner(tmp_path: Path, resolved: dict, workdir: str, chunk_log: Path | None = None) -> LearnerContext:
    """Rank 1 of attempt 1 of job ``job1`` in its own working folder (no manager: its reporter is never started)."""
    spec = LearnerSpec(job_id="job1", attempt=1, rank=1, world_size=2, manifest=resolved, manager_url="http://127.0.0.1:9",
                       results_store=resolved["results_store"], workdir=tmp_path / workdir, chunk_log=chunk_log)
    return LearnerContext(spec, token="unused")


def test_a_replaced_learner_keeps_its_predecessors_stored_chunk_lines(tmp_path: Path) -> None:
    resolved = parse_manifest(tiny_manifest(tmp_path)).resolved()
    stored = tmp_path / "results" / "jobs" / "job1" / "logs" / "attempt-1" / "chunks-1.jsonl"
    first = learner(tmp_path, resolved, "container-a")
    with ChunkRecord(first.open_chunk_record(), owner(1, 1)) as chunks:
        chunks.trained(0, 0, ["a"])
        chunks.trained(0, 2, ["b"])
    first.upload_log()  # at a checkpoint; then its container goes, its working folder with it
    second = learner(tmp_path, resolved, "container-b")  # the replacement: a fresh working folder
    path = second.open_chunk_record()
    assert path == tmp_path / "container-b" / "chunks.jsonl"
    with ChunkRecord(path, owner(1, 1)) as chunks:
        chunks.trained(0, 4, ["c"])
    second.upload_log()
    lines = read([stored])
    assert [line["chunk"] for line in lines] == [0, 2, 4], lines  # before: [4], the first two overwritten
    assert lines[0]["owner"] != lines[2]["owner"]  # same rank, attempt and pid: still two owners
    assert lines[0]["owner"].split(":")[:3] == lines[2]["owner"].split(":")[:3]
    # a record already in place (a swarm learner's, on the shared volume) is appended to, not fetched again
    shared = tmp_path / "shared" / "rank-1.jsonl"
    third = learner(tmp_path, resolved, "container-c", chunk_log=shared)
    shared.parent.mkdir()
    shared.write_text(stored.read_text() + '{"pass": 0, "chunk": 6, "owner": "1:1:7:00", "ids": ["d"]}\n')
    assert third.open_chunk_record() == shared
    assert [line["chunk"] for line in read([shared])] == [0, 2, 4, 6]
