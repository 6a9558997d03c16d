"""What a learner or shard placed on another host runs first (``labswarm compare --hosts``,
:mod:`labswarm.compare.hosts`): ``python -m labswarm.compare.host_env ENV_FILE ARGS...`` adds the variables of
``ENV_FILE`` (a JSON object of strings, on the shared filesystem, readable by its owner only: the attempt's token
is among them) to its environment, then replaces itself with ``python ARGS...`` (same pid). A host command such as
``ssh`` carries no environment, and the token stays off every command line. Imports nothing of labswarm."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    """Load ``argv[0]`` (the env file) into the environment and exec this interpreter with ``argv[1:]``.

    Raises:
        SystemExit: 2 when no env file or command is given.
        OSError: the env file cannot be read.
    """
    if len(argv) < 2:
        sys.exit("usage: python -m labswarm.compare.host_env ENV_FILE ARGS...")
    with open(argv[0], encoding="utf-8") as handle:
        os.environ.update({str(k): str(v) for k, v in json.load(handle).items()})
    os.execv(sys.executable, [sys.executable, *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
