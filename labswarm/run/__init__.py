"""``labswarm run``: an experiment end to end, as a session on a manager (embedded or running), then its model as
a training job of that manager.

Modules: :mod:`labswarm.run.experiment` (the run: :func:`run_experiment` with its :class:`RunOptions` and
:class:`RunHooks`; the dashboard's token file), :mod:`labswarm.run.training` (the training job, reused when an
identical one completed, and its result's table), :mod:`labswarm.run.reuse` (``labswarm train``'s own trainings,
reused alike), :mod:`labswarm.run.health` (the health controller in a thread, the session's health figure).
"""

from labswarm.run.experiment import (
    DASHBOARD_TOKEN_FILE,
    FINAL,
    RunHooks,
    RunOptions,
    RunResult,
    dashboard_line,
    run_experiment,
    write_private,
)
from labswarm.run.health import HealthThread, health_figure
from labswarm.run.training import JobTraining, job_manifest, reused_line, train_job, training_table

__all__ = [
    "DASHBOARD_TOKEN_FILE",
    "FINAL",
    "HealthThread",
    "JobTraining",
    "RunHooks",
    "RunOptions",
    "RunResult",
    "dashboard_line",
    "health_figure",
    "job_manifest",
    "reused_line",
    "run_experiment",
    "train_job",
    "training_table",
    "write_private",
]
