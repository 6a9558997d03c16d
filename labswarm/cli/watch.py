"""``labswarm watch EXPERIMENT --folder DIR --label RULE``: new audio files dropped into a folder become rows of the
experiment's labels CSV (:class:`labswarm.datasets.watch.FolderWatch`), which a followed session (``labswarm run
--follow``) publishes as they appear. Runs until interrupted (Ctrl-C, SIGTERM). Exit status 2 for a bad experiment
file or label rule (the message names the option), 0 when stopped.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from labswarm.cli.exits import USAGE
from labswarm.cli.output import err, fail
from labswarm.errors import ConfigError, LabswarmError


def watch_command(
    experiment: Annotated[Path, typer.Argument(help="The experiment YAML file: its dataset's labels CSV gets the "
                                               "rows, with paths relative to its dataset root.")],
    folder: Annotated[Path | None, typer.Option(help="The folder to watch (recursively); default the dataset root.")
                      ] = None,
    label: Annotated[str, typer.Option(help="How a new file's label is found: parent (its folder's name), "
                                       "regex:PATTERN (a group (?P<label>...) searched in its path under the "
                                       "folder) or fixed:LABEL.")] = "parent",
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between two looks at the folder; a file is "
                                            "taken once two looks in a row see it unchanged.")] = 1.0,
) -> None:
    """Append a row to the experiment's labels CSV for each new complete audio file of a folder, until stopped."""
    from labswarm.config.experiment import load_experiment
    from labswarm.datasets.watch import FolderWatch, parse_rule

    try:
        config = load_experiment(experiment)
        try:
            rule = parse_rule(label)
        except ValueError as exc:
            raise ConfigError([("--label", str(exc))]) from None
        root = Path(config.dataset.root)
        watched = root if folder is None else folder
        if not watched.is_dir():
            raise ConfigError([("--folder", f"{watched} is not a folder")])
        watch = FolderWatch(watched, config.dataset.labels_path, rule, root)
    except LabswarmError as exc:
        raise fail(exc, USAGE) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    err.print(f"watching {watch.folder} for audio files; rows go to {watch.labels} (label rule: {label})",
              highlight=False)
    try:
        while not stop.is_set():
            for path, name in watch.poll():
                err.print(f"{path},{name}", highlight=False, markup=False)
            stop.wait(interval)
    except KeyboardInterrupt:
        pass
