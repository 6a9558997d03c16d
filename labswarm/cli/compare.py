"""``labswarm compare``: the framework comparison (:mod:`labswarm.compare.run`), each run a training job of an
embedded manager or of a running one (``--manager``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from labswarm.cli.experiment import load
from labswarm.cli.output import console
from labswarm.cli.output import fail as _fail
from labswarm.errors import ConfigError, LabswarmError

#: ``--seed``: an int >= 0 as the manifest's ``training.seed`` (a bad value exits 2 naming ``--seed``).
SeedOption = Annotated[int | None, typer.Option(
    min=0, help="Every run's training.seed (an integer >= 0): the sample order, crops, initial weights and dropout, "
                "not the features. Default: the experiment's (its training.seed, else its seed).")]
#: ``--budget``: the processes of the topology search (:mod:`labswarm.compare.budget`).
BudgetOption = Annotated[int | None, typer.Option(
    min=1, help="Search the topologies that fit this many processes (learners + separate shards) instead of "
                "--framework/--learners: a short trial of each, then the --keep best for --epochs; reports the "
                "least time to --target and the table of what was tried (budget.md, budget.json).")]


def _printer() -> Any:
    """Prints each job's start and each epoch's metrics record (rank 0's) as they arrive."""
    from labswarm.jobs.client.follow import epoch_line

    def on_event(job_id: str, event: dict[str, Any]) -> None:
        data = event["data"]
        if event["event"] == "metric" and "epoch" in data:
            console.print(f"  {job_id}  {epoch_line(data)}", highlight=False, markup=False)
        elif event["event"] == "status" and data.get("status") in ("running", "completed", "failed", "halted"):
            console.print(f"{job_id}: {data['status']}", highlight=False, markup=False)
    return on_event


def _search(experiment: Path, budget: int, output: Path, options: Any, keep: int, trial_epochs: int,
            manager: str | None, token: str | None) -> None:
    """``--budget``: the search (:func:`labswarm.compare.budget.search`), its report printed."""
    from labswarm.compare.budget import render, search

    report = search(experiment, budget, output, options, keep=keep, trial_epochs=trial_epochs, manager_url=manager,
                    token=token, on_event=_printer())
    console.print(render(report), highlight=False, markup=False)
    console.print(f"budget.md and budget.json in {output}")


def _refuse_with_budget(frameworks: Any, learners: str | None, ps_shards: int | None) -> None:
    """``--budget`` sets the frameworks, learner counts and shards itself: any of them given besides it is refused
    (exit 2 naming the option), not silently ignored.

    Raises:
        typer.Exit: code 2, with the fields ``budget`` (``--framework``/``--frameworks``), ``learners`` or
            ``ps_shards``.
    """
    errors = []
    if frameworks:
        errors.append(("budget", "searches the topologies itself: not with --framework/--frameworks"))
    if learners is not None:
        errors.append(("learners", "not with --budget: the search sets the learner counts itself"))
    if ps_shards is not None:
        errors.append(("ps_shards", "not with --budget: the search sets the shards itself"))
    if errors:
        raise _fail(ConfigError(errors))


def compare_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML with model and training sections.")],
    framework: Annotated[list[str] | None, typer.Option(
        "--framework", help="A framework to compare, repeatable: NAME or NAME:key=value,key=value (its "
                            "parameters), or a SINGA topology, topology:worker_groups=2,workers_per_group=2,"
                            "colocated=false (run with its own learners). Default: allreduce and downpour.")] = None,
    frameworks: Annotated[str | None, typer.Option(help="Comma-separated framework names (the same as repeated "
                                                        "--framework NAME).")] = None,
    learners: Annotated[str | None, typer.Option(help="Comma-separated learner counts; each framework runs with "
                                                      "each count >= 2, and 1 runs the single-process trainer "
                                                      "once. Default: 1,2.")] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help="Override training.epochs.")] = None,
    target: Annotated[float, typer.Option(min=0.0, max=1.0, help="Validation accuracy to time.")] = 0.8,
    seed: SeedOption = None,
    ps_shards: Annotated[int | None, typer.Option(min=1, help="Parameter-server shards. Default: 1.")] = None,
    threads: Annotated[int, typer.Option(min=1, help="Torch threads (and CPUs) per learner.")] = 1,
    output: Annotated[Path | None, typer.Option(
        help="Output folder; default <LABSWARM_HOME>/compare/<UTC stamp> when that home exists (the dashboard's "
             "/ui/compare lists it), else ./compare.")] = None,
    owner: Annotated[str | None, typer.Option(help="User recorded as the run's owner (may see it on the "
                                                   "dashboard; admins see every run).")] = None,
    manager: Annotated[str | None, typer.Option(
        help="Run the jobs on this manager (its data roots must hold the experiment's folders and "
             "OUTPUT/results); default: a manager embedded in this process.")] = None,
    token_file: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, help="File holding --manager's API token (default: LABSWARM_API_TOKEN).")] = None,
    hosts: Annotated[str | None, typer.Option(
        help="Run the learners and shards on these machines: b,c or b=10.0.0.2,c=10.0.0.3 (name=address). "
             "Learner r runs on host r mod N, the shards on the last host; the manager stays here, on --address. "
             "The hosts must share this machine's interpreter, data and --output folders at the same paths "
             "(NFS). See docs/guides/distributed-training.md, Across machines.")] = None,
    host_command: Annotated[str, typer.Option(
        help="How to run a process on a host: a command the process's words follow, with {host} and {address} "
             "(e.g. 'ip netns exec {host}').")] = "ssh -tt -o BatchMode=yes {host}",
    address: Annotated[str | None, typer.Option(
        help="With --hosts: this machine's address as the hosts reach it (the manager and each job's "
             "coordinator listen there).")] = None,
    gloo_ifname: Annotated[str | None, typer.Option(
        help="With --hosts: the network interface gloo uses on the hosts (GLOO_SOCKET_IFNAME).")] = None,
    budget: BudgetOption = None,
    keep: Annotated[int, typer.Option(min=1, help="With --budget: trials that go on to a full run.")] = 2,
    trial_epochs: Annotated[int, typer.Option(min=1, help="With --budget: epochs of a trial.")] = 1,
) -> None:
    """Train the experiment under each framework and learner count, one training job after another (same model,
    data, seed, epochs, per-learner batch and schedule), and write a table, plots and compare.json into the
    output folder."""
    from labswarm.compare.run import DEFAULT_FRAMEWORKS, CompareOptions, compare, default_output, parse_learners, table
    from labswarm.settings import Settings, load_settings

    if budget is not None:
        _refuse_with_budget(framework or frameworks, learners, ps_shards)
    if manager is None:  # the files it names, checked before any learner starts (a manager's are its own)
        load(experiment)
    if output is None:
        output = default_output(Settings().home)
    names = [*(framework or []), *(n.strip() for n in (frameworks or "").split(",") if n.strip())]
    token = None
    if manager is not None:
        token = token_file.read_text().strip() if token_file is not None else load_settings().api_token
    try:
        placed = None
        if hosts is not None:
            from labswarm.compare.hosts import parse_hosts

            placed = parse_hosts(hosts, address, host_command,
                                 env={"GLOO_SOCKET_IFNAME": gloo_ifname} if gloo_ifname else None)
        options = CompareOptions(learners=parse_learners(learners if learners is not None else "1,2"),
                                 epochs=epochs, target=target, ps_shards=ps_shards if ps_shards is not None else 1,
                                 threads=threads, owner=owner, hosts=placed, seed=seed)
        if budget is not None:
            return _search(experiment, budget, output, options, keep, trial_epochs, manager, token or None)
        rows = compare(experiment, names or list(DEFAULT_FRAMEWORKS), output, options, manager_url=manager,
                       token=token or None, on_event=_printer())
    except LabswarmError as exc:
        raise _fail(exc) from None
    console.print(table(rows), highlight=False, markup=False)
    console.print(f"figures, plots and compare.json in {output}")
