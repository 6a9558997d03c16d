"""``labswarm compare --budget N``: the training framework that reaches the target accuracy soonest with N processes
(issue 23 item 5, the question SINGA's paper leaves open: "given a fixed budget (e.g., number of nodes in a
cluster), there lies the opportunity to find the optimal hybrid training framework"; Ooi et al., ACM MM 2015).

1. **Enumerate** (:func:`candidates`) every SINGA cluster topology (:mod:`labswarm.config.topology`) that fits
   ``N`` processes (learners + separate parameter-server shards) and that a framework runs: the single-process
   trainer (1 process); per learner count ``L`` (2 … N) and group size ``w`` dividing it, one worker group
   (``allreduce``, colocated shards) or ``L / w`` groups each with its own colocated server group
   (``distributed_hogwild``, the hybrid for ``w`` > 1, synchronised every ``sync_period`` steps), and with ``S``
   separate shards
   (``L + S <= N``) one server group (``sandblaster`` for one worker group, ``downpour`` for several).
2. **Prune** with a short trial of each (``trial_epochs`` epochs as a training job, one after another): its time to
   the target where the trial reached it, else an estimate (:func:`estimate`); the ``keep`` best go on.
   A synchronous candidate whose learners cannot split the experiment's batch (``batch: global``, the default of
   ``allreduce`` and ``sandblaster``, needs a batch size divisible by ``L``) runs with ``batch: per_learner``
   (:func:`fit_batch`), shown in its spec.
3. **Run** the kept ones for the experiment's epochs (the trial is reused when it was as long) and report the one
   with the least time to the target (none reached: the best final accuracy), with the table of every trial and run.

The search and its report run unchanged on the hosts of a cluster (``CompareOptions.hosts``), where ``N`` is larger.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from labswarm.compare.report import table
from labswarm.compare.run import CompareOptions, run_all
from labswarm.compare.specs import topology_spec
from labswarm.errors import ConfigError

#: The most processes a budget may name here (the candidates grow about as N log N; each is a job).
MAX_BUDGET = 16


def candidates(budget: int, sync_period: int = 4) -> list[tuple[int, dict[str, Any] | None]]:
    """The runs that fit ``budget`` processes (module docstring, step 1): ``(learners, framework spec)``, ``None``
    for the single-process trainer; a spec's ``topology`` holds the setting, and ``processes`` (learners + separate
    shards) is ``learners + topology ps shards``.

    Raises:
        ConfigError: ``budget`` below 1 or above :data:`MAX_BUDGET` (field ``budget``).
    """
    if not 1 <= budget <= MAX_BUDGET:
        raise ConfigError([("budget", f"processes for the search: 1 to {MAX_BUDGET}, got {budget}")])
    out: list[tuple[int, dict[str, Any] | None]] = [(1, None)]
    for learners in range(2, budget + 1):
        for size in (w for w in range(1, learners + 1) if learners % w == 0):
            groups = learners // size
            colocated: dict[str, Any] = {"worker_groups": groups, "workers_per_group": size}
            if groups > 1:
                colocated.update(server_groups=groups, sync_period=sync_period)
            out.append((learners, topology_spec(colocated)))
            for shards in range(1, budget - learners + 1):
                out.append((learners, topology_spec({"worker_groups": groups, "workers_per_group": size,
                                                     "colocated": False, "shards_per_group": shards})))
    return out


Run = tuple[int, dict[str, Any] | None]


def fit_batch(runs: list[Run], experiment: Any) -> list[Run]:
    """``runs`` with ``batch: per_learner`` set on each whose framework cannot split ``experiment``'s batch size
    (its pipeline's ``batch`` block) across its learners
    (:meth:`~labswarm.config.frameworks.DistributedFramework.batch_problem`); the others unchanged."""
    from labswarm.config.frameworks import DistributedFramework

    size = next((getattr(b, "size", None) for b in experiment.pipeline if b.name == "batch"), None)
    fitted: list[Run] = []
    for n, spec in runs:
        if spec is not None and size is not None and DistributedFramework.model_validate(spec).batch_problem(
                n, int(size)) is not None:
            spec = {**spec, "batch": "per_learner"}
        fitted.append((n, spec))
    return fitted


def processes(run: tuple[int, Mapping[str, Any] | None]) -> int:
    """The processes a run takes: its learners and its separate shards."""
    learners, spec = run
    topology = (spec or {}).get("topology") or {}
    return learners + (0 if topology.get("colocated", True) else int(topology.get("shards_per_group") or 1))


def estimate(row: Mapping[str, Any]) -> float:
    """A trial's time to the target (s): the time it took where the trial reached it, else its wall time scaled by
    the accuracy still missing, ``wall · target / accuracy`` (linear in accuracy: a rough guess, used only to
    order the trials; ``inf`` without accuracy)."""
    if row.get("time_to_target_s") is not None:
        return float(row["time_to_target_s"])
    accuracy = row.get("final_val_accuracy") or 0.0
    return float(row["wall_s"]) * float(row["target"]) / accuracy if accuracy > 0 else math.inf


def search(experiment: Path, budget: int, output: Path, options: CompareOptions | None = None, *, keep: int = 2,
           trial_epochs: int = 1, sync_period: int = 4, manager_url: str | None = None, token: str | None = None,
           on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The budget search (module docstring); writes ``budget.json`` (every row, the trials' estimates, the best)
    and ``budget.md`` (the tables) into ``output``, the jobs' state and results in ``output/trials`` and
    ``output/runs``.

    Args:
        experiment: the experiment YAML (with ``model`` and ``training``).
        budget: ``N``, the processes a run may take (learners + separate shards).
        output: the output folder.
        options: epochs of the full runs (``None``: the experiment's), target, threads, timeout, hosts (its
            ``learners`` and ``ps_shards`` are not used: the candidates set them).
        keep: the trials that go on to a full run (>= 1).
        trial_epochs: epochs of a trial (>= 1).
        sync_period: the steps between two synchronisations of the candidates with several server groups.

    Returns:
        ``{"budget", "target", "trials": rows with "processes", "estimate_s" and "kept", "runs": rows,
        "best": the best run's row}``.

    Raises:
        ConfigError: a bad budget, ``keep`` or ``trial_epochs`` (named), or an experiment the jobs cannot train.
        CompareError: a job failed. ManagerError: the manager refused a job or cannot be reached.
    """
    from labswarm.config.experiment import load_experiment

    opts = options if options is not None else CompareOptions()
    if keep < 1 or trial_epochs < 1:
        raise ConfigError([("keep" if keep < 1 else "trial_epochs", "must be at least 1")])
    config = load_experiment(Path(experiment))
    runs = fit_batch(candidates(budget, sync_period), config)
    output = Path(output).resolve()
    trials = run_all(config, runs, output / "trials", opts, trial_epochs, manager_url=manager_url, token=token,
                     on_event=on_event)
    for run, row in zip(runs, trials, strict=True):
        row.update(processes=processes(run), estimate_s=estimate(row), kept=False)
    order = sorted(range(len(runs)), key=lambda i: (trials[i]["estimate_s"], -(trials[i]["final_val_accuracy"] or 0)))
    chosen = sorted(order[:keep])
    for i in chosen:
        trials[i]["kept"] = True
    epochs = opts.epochs if opts.epochs is not None else config.training.epochs if config.training else trial_epochs
    if epochs == trial_epochs:  # the trials were the full runs
        finals = [trials[i] for i in chosen]
    else:
        finals = run_all(config, [runs[i] for i in chosen], output / "runs", opts, epochs, manager_url=manager_url,
                         token=token, on_event=on_event)
        for i, row in zip(chosen, finals, strict=True):
            row["processes"] = trials[i]["processes"]
    best = min(finals, key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0,
                                      -(r["final_val_accuracy"] or 0.0)))
    report = {"experiment": str(experiment), "budget": budget, "target": opts.target, "trial_epochs": trial_epochs,
              "epochs": epochs, "keep": keep, "trials": trials, "runs": finals, "best": best}
    output.mkdir(parents=True, exist_ok=True)
    (output / "budget.json").write_text(json.dumps(report, indent=1, default=str))
    (output / "budget.md").write_text(render(report))
    return report


def render(report: Mapping[str, Any]) -> str:
    """``budget.md``: the best setting, the trials (processes, estimate, kept) and the full runs' table."""
    best = report["best"]
    ttt = "not reached" if best["time_to_target_s"] is None else f"{best['time_to_target_s']:.1f} s"
    lines = [f"Budget {report['budget']} processes, target {report['target']}: best {best['label']} "
             f"({best['processes']} processes), time to target {ttt}, final accuracy "
             f"{best['final_val_accuracy'] if best['final_val_accuracy'] is not None else '-'}", "",
             f"Trials ({report['trial_epochs']} epoch(s) each; the {report['keep']} best by estimated time to target "
             "go on):", "", "| setting | processes | trial val acc | estimate (s) | kept |", "|---|---|---|---|---|"]
    for row in report["trials"]:
        acc = "-" if row["final_val_accuracy"] is None else f"{row['final_val_accuracy']:.3f}"
        est = "-" if math.isinf(row["estimate_s"]) else f"{row['estimate_s']:.1f}"
        lines.append(f"| {row['label']} | {row['processes']} | {acc} | {est} | {'yes' if row['kept'] else 'no'} |")
    lines += ["", f"Full runs ({report['epochs']} epoch(s)):", "", table(list(report["runs"]))]
    return "\n".join(lines)
