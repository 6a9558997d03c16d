"""The runs ``labswarm compare`` is asked for (:mod:`labswarm.compare.run`): framework specs from the command line
(``name``, ``name:key=value,...``, or a SINGA cluster topology, ``topology:worker_groups=2,...``), the learners a
topology fixes, and the learner counts (``"1,2"``). Each error names its field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from labswarm.errors import ConfigError


def parse_frameworks(specs: Sequence[str]) -> list[dict[str, Any]]:
    """Framework specs from the command line: ``name`` or ``name:key=value,key=value`` (values read as YAML), or a
    SINGA cluster topology, ``topology:worker_groups=2,workers_per_group=2,colocated=false`` (issue 23: a hybrid
    setting compared with the presets; :func:`topology_spec`).

    Returns:
        ``[{"name": ..., **params}, ...]``, in order (a topology's with its ``topology``).

    Raises:
        ConfigError: none given, an unknown name, a malformed parameter, a topology no framework runs (naming its
            field, ``framework.topology.<field>``), or a name given twice with the same parameters (field
            ``framework``).
    """
    from labswarm.config.frameworks import DISTRIBUTED_FRAMEWORKS

    if not specs:
        raise ConfigError([("framework", "name at least one framework")])
    out: list[dict[str, Any]] = []
    for spec in specs:
        name, _, rest = spec.strip().partition(":")
        if name not in (*DISTRIBUTED_FRAMEWORKS, "topology"):
            known = ", ".join(DISTRIBUTED_FRAMEWORKS)
            raise ConfigError([("framework", f"unknown framework {name!r}; one of {known}, or topology:...")])
        params: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ConfigError([(f"framework.{name}", f"expected key=value, got {item!r}")])
            params[key.strip()] = yaml.safe_load(value)
        fw = topology_spec(params) if name == "topology" else {"name": name, **params}
        if fw in out:
            raise ConfigError([("framework", f"{spec!r} is named twice")])
        out.append(fw)
    return out


def topology_spec(topology: Mapping[str, Any]) -> dict[str, Any]:
    """The framework spec of a topology given alone: the framework that runs it, the parameters it implies
    (``group_size``, ``sync_period``), the keys that are not topology fields (that framework's parameters:
    ``timeout_s``, ``n_fetch``; validated with the job) and the topology
    (:func:`labswarm.config.topology.implementing`).

    Raises:
        ConfigError: an invalid topology, or one no framework runs yet; the field named under
            ``framework.topology``.
    """
    from pydantic import ValidationError

    from labswarm.config.topology import Topology, implementing
    from labswarm.plugin import field_errors

    parameters = {k: v for k, v in topology.items() if k not in Topology.model_fields}  # timeout_s=300, n_fetch=2
    topology = {k: v for k, v in topology.items() if k in Topology.model_fields}
    try:
        resolved = Topology.model_validate(dict(topology))
    except ValidationError as exc:
        raise ConfigError([(f"framework.topology.{'.'.join(map(str, loc))}", why)
                           for loc, why in field_errors(exc, Topology)]) from None
    try:
        name, implied = implementing(resolved)
    except ConfigError as exc:
        raise ConfigError([(f"framework.{path}", why) for path, why in exc.errors]) from None
    return {"name": name, **{k: v for k, v in implied.items() if v is not None}, **parameters,
            "topology": dict(topology)}


def topology_learners(framework: Mapping[str, Any]) -> int | None:
    """The learners a spec's ``topology`` fixes (worker groups × workers per group), ``None`` without one."""
    topology = framework.get("topology")
    if not isinstance(topology, Mapping):
        return None
    return int(topology["worker_groups"]) * int(topology["workers_per_group"])


def parse_learners(text: str | Sequence[int]) -> list[int]:
    """Learner counts: ``"1,2"`` (or a sequence of ints) → ``[1, 2]``, sorted, without repeats.

    Raises:
        ConfigError: empty, not integers, or below 1 (field ``learners``).
    """
    items = [str(i) for i in text] if not isinstance(text, str) else [p for p in text.split(",") if p.strip()]
    try:
        counts = sorted({int(i) for i in items})
    except ValueError:
        raise ConfigError([("learners", f"expected comma-separated integers, got {text!r}")]) from None
    if not counts or counts[0] < 1:
        raise ConfigError([("learners", f"expected learner counts of at least 1, got {text!r}")])
    return counts
