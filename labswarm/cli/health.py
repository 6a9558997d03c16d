"""``labswarm health``: the health controller (the control loop that steers every session's publish rate) and
``labswarm health plot`` (a session's figure)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from labswarm.cli.exits import USAGE
from labswarm.cli.ids import resolve
from labswarm.cli.output import console, err, fail
from labswarm.errors import ConfigError, LabswarmError

HEALTH_LOGS = Path(".labswarm/health")
health_app = typer.Typer(help="The health controller: steer every session's publish rate.")


@health_app.callback(invoke_without_command=True)
def health(
    ctx: typer.Context,
    manager: Annotated[str | None, typer.Option(help="Manager URL.")] = None,
    rabbitmq_api: Annotated[str | None, typer.Option(envvar="LABSWARM_RABBITMQ_API", help="RabbitMQ management "
                                                     "API, e.g. http://guest:guest@localhost:15672 (its password: "
                                                     "better in LABSWARM_RABBITMQ_API than here, where ps shows "
                                                     "it); none: ledger only.")] = None,
    rabbitmq_api_file: Annotated[Path | None, typer.Option(envvar="LABSWARM_RABBITMQ_API_FILE", help="A file "
                                                           "holding the --rabbitmq-api URL (a docker secret).")
                                 ] = None,
    controller: Annotated[str, typer.Option(help="Controller name (pi, aimd).")] = "pi",
    period: Annotated[float, typer.Option(min=0.1, help="Seconds between decisions.")] = 1.0,
    log_dir: Annotated[Path, typer.Option(help="Where each session's decisions are logged.")] = HEALTH_LOGS,
    metrics_port: Annotated[int | None, typer.Option(help="Serve the decisions as Prometheus metrics here.")] = None,
    metrics_host: Annotated[str, typer.Option(help="Address of --metrics-port: this machine only by default; "
                                              "another needs LABSWARM_METRICS_TOKEN (or its _FILE), which every "
                                              "scrape must then send as a Bearer token.")] = "127.0.0.1",
    max_total_waiting: Annotated[int | None, typer.Option(
        min=0, help="Budget of messages waiting in all sessions' queues together; 0: no budget (default: "
        "LABSWARM_MAX_TOTAL_WAITING, 2000).")] = None,
) -> None:
    """Run the control loop until interrupted (Ctrl-C). Running sessions share the workers by weight."""
    if ctx.invoked_subcommand is not None:
        return
    if manager is None:
        err.print("[bold red]error:[/] --manager is required")
        raise typer.Exit(USAGE)
    import asyncio

    from labswarm.auth.quotas import Policies
    from labswarm.health.loop import HealthLoop
    from labswarm.health.monitors import ManagerMonitor, RabbitMQMonitor
    from labswarm.settings import load_settings

    settings = load_settings(max_total_waiting=max_total_waiting)
    if rabbitmq_api is None and rabbitmq_api_file is not None:
        try:
            rabbitmq_api = rabbitmq_api_file.read_text().strip()
        except OSError as exc:
            raise fail(ConfigError([("--rabbitmq-api-file", f"cannot read {rabbitmq_api_file}: "
                                                             f"{exc.strerror or exc}")]), USAGE) from None
    try:
        weights = Policies.from_settings(settings).weight  # LABSWARM_USER_WEIGHTS, the tokens file's weights
    except ConfigError as exc:
        raise fail(exc, USAGE) from None
    loop = HealthLoop(ManagerMonitor(manager, settings.api_token),
                      RabbitMQMonitor(rabbitmq_api) if rabbitmq_api else None,
                      controller={"name": controller}, period=period, log_dir=log_dir,
                      max_total_waiting=settings.max_total_waiting,
                      user_weight=weights, weights_from_manager=True)  # with an admin's overrides, when told
    if metrics_port:
        from labswarm.health.metrics_server import serve_metrics

        try:  # loopback unless a scrape token guards it (labswarm/health/metrics_server.py)
            serve_metrics(loop.registry, metrics_port, metrics_host, settings.metrics_token)
        except ConfigError as exc:
            raise fail(exc, USAGE) from None
    console.print(f"health controller ({controller}) on {manager}; decisions in {log_dir}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(loop.run())


@health_app.command("plot")
def health_plot(
    session: Annotated[str, typer.Argument(help="Session id, or any unique start of it.")],
    log_dir: Annotated[Path, typer.Option(help="Where the decisions were logged.")] = HEALTH_LOGS,
    out: Annotated[Path | None, typer.Option(help="PNG to write (default: LOG_DIR/health-SESSION.png).")] = None,
) -> None:
    """Draw a session's queue depth (top) and publish vs consume rate (bottom) as a PNG."""
    from labswarm.health.plot import plot_session

    try:
        session = resolve(session, "session", lambda: [p.stem.removeprefix("health-")
                                                       for p in sorted(log_dir.glob("health-*.jsonl"))])
        png = plot_session(log_dir / f"health-{session}.jsonl", out or log_dir / f"health-{session}.png",
                           title=f"session {session}")
    except LabswarmError as exc:
        raise fail(exc) from None
    console.print(f"wrote {png}")
