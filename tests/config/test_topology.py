"""SINGA's cluster topology (issue 23 item 1): the named frameworks resolve to their topology, a topology to the
framework that runs it, and bad combinations are refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from labswarm.config.manifest import parse_manifest
from labswarm.config.topology import PRESETS, Topology, implementing, preset
from labswarm.errors import ConfigError


def manifest(learners: int, framework: dict[str, Any], **extra: Any) -> Any:
    return parse_manifest({"name": "job", "experiment": "music_speech_noise", "learners": learners,
                           "framework": framework, "results_store": {"name": "local", "path": "/tmp/results"},
                           **extra})


def topology(**fields: Any) -> dict[str, Any]:
    return Topology(**fields).model_dump(mode="json")


# (framework, learners, ps_shards, the topology it runs): SINGA's four settings (Ooi et al. 2015) and easgd
PRESET_CASES = [
    ({"name": "allreduce"}, 3, None,  # (b): one worker group, its shards bound one to each worker
     {"worker_groups": 1, "workers_per_group": 3, "server_groups": 1, "shards_per_group": 3, "colocated": True,
      "serves": [[0]], "sync_period": None}),
    ({"name": "sandblaster"}, 3, 2,  # (a): one worker group, one separate server group
     {"worker_groups": 1, "workers_per_group": 3, "server_groups": 1, "shards_per_group": 2, "colocated": False,
      "serves": [[0]], "sync_period": None}),
    ({"name": "downpour", "group_size": 2}, 4, 2,  # (c): worker groups sharing one separate server group
     {"worker_groups": 2, "workers_per_group": 2, "server_groups": 1, "shards_per_group": 2, "colocated": False,
      "serves": [[0, 1]], "sync_period": None}),
    ({"name": "distributed_hogwild", "sync_period": 5}, 3, None,  # (d): a server group per worker, synchronised
     {"worker_groups": 3, "workers_per_group": 1, "server_groups": 3, "shards_per_group": 1, "colocated": True,
      "serves": [[0], [1], [2]], "sync_period": 5}),
    ({"name": "distributed_hogwild", "sync_period": 3, "group_size": 2}, 4, None,  # the hybrid of (b) and (d)
     {"worker_groups": 2, "workers_per_group": 2, "server_groups": 2, "shards_per_group": 2, "colocated": True,
      "serves": [[0], [1]], "sync_period": 3}),
    ({"name": "model_averaging", "period": 5}, 3, None,  # (d)'s topology, all replicas averaged synchronously
     {"worker_groups": 3, "workers_per_group": 1, "server_groups": 3, "shards_per_group": 1, "colocated": True,
      "serves": [[0], [1], [2]], "sync_period": 5}),
    ({"name": "easgd"}, 2, None,
     {"worker_groups": 2, "workers_per_group": 1, "server_groups": 1, "shards_per_group": 1, "colocated": False,
      "serves": [[0, 1]], "sync_period": None}),
]


@pytest.mark.parametrize(("framework", "learners", "shards", "expected"), PRESET_CASES,
                         ids=[c[0]["name"] for c in PRESET_CASES])
def test_each_named_framework_resolves_to_its_topology_shown_in_the_resolved_manifest(
        framework: dict[str, Any], learners: int, shards: int | None, expected: dict[str, Any]) -> None:
    extra = {} if shards is None else {"ps_shards": shards}
    job = manifest(learners, framework, **extra)
    resolved = job.resolved()
    assert resolved["framework"]["topology"] == expected
    assert resolved["framework"]["name"] == framework["name"]
    assert parse_manifest(resolved).framework == job.framework  # the resolved manifest loads back the same
    assert job.shards == Topology(**expected).ps_shards  # the shards the job deploys are the topology's


#: easgd shares downpour's topology, model_averaging Distributed Hogwild's: a topology alone is the other's
ALONE = [c for c in PRESET_CASES if c[0]["name"] not in ("easgd", "model_averaging")]


@pytest.mark.parametrize(("framework", "learners", "shards", "expected"), ALONE, ids=[c[0]["name"] for c in ALONE])
def test_each_topology_alone_resolves_to_the_framework_that_runs_it(
        framework: dict[str, Any], learners: int, shards: int | None, expected: dict[str, Any]) -> None:
    spec = {k: v for k, v in expected.items() if v is not None}
    job = manifest(learners, {"topology": spec})
    assert job.framework.model_dump(mode="json") == manifest(learners, framework,
                                                             **({} if shards is None else {"ps_shards": shards})
                                                             ).framework.model_dump(mode="json")


def test_a_short_topology_fills_in_singas_defaults() -> None:
    job = manifest(2, {"topology": {"worker_groups": 1, "workers_per_group": 2}})  # SINGA's defaults: colocated
    assert job.framework.name == "allreduce"
    assert job.framework.topology == Topology(worker_groups=1, workers_per_group=2, server_groups=1,
                                              shards_per_group=2, colocated=True, serves=[[0]])
    separate = manifest(4, {"topology": {"worker_groups": 2, "workers_per_group": 2, "colocated": False}})
    assert (separate.framework.name, separate.framework.model_dump()["group_size"], separate.shards) == \
        ("downpour", 2, 1)


def test_every_preset_is_run_by_its_own_framework() -> None:
    for name, make in PRESETS.items():
        runs, params = implementing(make(4, 2, group_size=2, period=3, sync_period=3))
        shared = {"easgd": "downpour", "model_averaging": "distributed_hogwild"}  # the same topology: name it
        assert runs == shared.get(name, name)
        group_size = 1 if name == "easgd" else 2
        hogwild = {"sync_period": 3, "group_size": 2 if name == "distributed_hogwild" else 1}  # groups: the hybrid
        assert params == {"downpour": {"group_size": group_size}, "distributed_hogwild": hogwild}.get(runs, {})
    assert preset("downpour", 6, 1, {"group_size": 3}).worker_groups == 2
    assert preset("model_averaging", 2, None, {"period": 3}).sync_period == 3
    named = manifest(2, {"name": "model_averaging", "topology": {"worker_groups": 2, "workers_per_group": 1,
                                                                 "server_groups": 2, "sync_period": 3}})
    assert named.framework.model_dump()["period"] == 3  # the topology's sync period is model_averaging's period


BAD = [  # (learners, framework, extra, the path the error names)
    (4, {"topology": {"worker_groups": 2, "workers_per_group": 2, "server_groups": 3}},
     {}, "framework.topology.server_groups"),
    (3, {"topology": {"worker_groups": 3, "workers_per_group": 1, "server_groups": 2, "sync_period": 2}},
     {}, "framework.topology.serves"),
    (2, {"topology": {"worker_groups": 2, "workers_per_group": 1, "server_groups": 2}},
     {}, "framework.topology.sync_period"),
    (2, {"topology": {"worker_groups": 1, "workers_per_group": 2, "sync_period": 3}},
     {}, "framework.topology.sync_period"),
    (2, {"topology": {"worker_groups": 2, "workers_per_group": 1, "server_groups": 2, "sync_period": 1,
                      "serves": [[0, 0], [1]]}}, {}, "framework.topology.serves.0"),
    (2, {"topology": {"worker_groups": 1, "workers_per_group": 2, "shards_per_group": 3}},
     {}, "framework.topology.shards_per_group"),
    (2, {"topology": {"worker_groups": 0, "workers_per_group": 2}}, {}, "framework.topology.worker_groups"),
    (2, {"topology": {"worker_groups": 1, "workers_per_group": 2, "racks": 2}}, {}, "framework.topology.racks"),
    (3, {"topology": {"worker_groups": 1, "workers_per_group": 2}}, {}, "framework.topology.worker_groups"),
    (4, {"topology": {"worker_groups": 2, "workers_per_group": 2, "colocated": False, "shards_per_group": 2}},
     {"ps_shards": 3}, "framework.topology.shards_per_group"),
    (4, {"name": "downpour", "group_size": 4,
         "topology": {"worker_groups": 2, "workers_per_group": 2, "colocated": False}}, {}, "framework.group_size"),
    (2, {"name": "model_averaging", "period": 5,
         "topology": {"worker_groups": 2, "workers_per_group": 1, "server_groups": 2, "sync_period": 3}},
     {}, "framework.period"),
    (2, {"name": "distributed_hogwild", "sync_period": 5,
         "topology": {"worker_groups": 2, "workers_per_group": 1, "server_groups": 2, "sync_period": 3}},
     {}, "framework.sync_period"),
    (4, {"name": "sandblaster", "topology": {"worker_groups": 2, "workers_per_group": 2, "colocated": False}},
     {}, "framework.topology.worker_groups"),
    # settings no framework runs yet
    (4, {"topology": {"worker_groups": 4, "workers_per_group": 1, "server_groups": 2, "sync_period": 3}},
     {}, "framework.topology.server_groups"),
    (4, {"topology": {"worker_groups": 2, "workers_per_group": 2, "server_groups": 2, "sync_period": 3,
                      "colocated": False}}, {}, "framework.topology.server_groups"),
    (4, {"topology": {"worker_groups": 2, "workers_per_group": 2, "shards_per_group": 4}},
     {}, "framework.topology.colocated"),
    (2, {"name": "allreduse"}, {}, "framework.name"),
    (2, {}, {}, "framework.name"),
]


@pytest.mark.parametrize(("learners", "framework", "extra", "path"), BAD, ids=[b[3] for b in BAD])
def test_a_bad_combination_is_refused_naming_the_field(learners: int, framework: dict[str, Any],
                                                       extra: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        manifest(learners, framework, **extra)
    assert path in [p for p, _ in caught.value.errors], caught.value
    assert f"{path}: " in str(caught.value)


def test_the_topology_model_locates_its_own_errors() -> None:
    with pytest.raises(ValidationError) as caught:
        Topology(worker_groups=2, workers_per_group=1, server_groups=2, sync_period=1, serves=[[0], [3]])
    assert [e["loc"] for e in caught.value.errors()] == [("serves", 1)]
    assert "worker group 3 does not exist" in str(caught.value)
