"""Run one parameter-server shard: ``python -m labswarm.train.distributed.ps --shard K --learners N --checkpoint-dir
DIR``.

The lifecycle manager starts ``ps_shards`` of these before the learners, each on its own port, and hands the
addresses to the learners (``LABSWARM_PS_ADDRS``). The shard binds and listens on its port first, before it imports
torch (seconds on a loaded machine, in which another process could take a revived shard's old port): learners
connecting meanwhile wait in the socket's backlog. It prints ``listening on HOST:PORT`` once it serves (torch
imported, the checkpoint loaded), and writes ``PORT`` to ``--ready-file`` when given. It runs until killed
(SIGTERM: it checkpoints first). The job's secret comes from the environment only (``LABSWARM_PS_SECRET``,
:mod:`labswarm.train.distributed.ps.auth`): learners must prove it on connect; without it the shard listens on
loopback only.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from labswarm.errors import ConfigError
from labswarm.train.distributed.ps.auth import SECRET_ENV, listen


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, load the shard's checkpoint if any, serve until SIGTERM / SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m labswarm.train.distributed.ps", description=__doc__)
    parser.add_argument("--shard", type=int, required=True, help="this shard's index, from 0")
    parser.add_argument("--learners", type=int, required=True, help="learners in the job (a synchronous round)")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10, help="updates between checkpoints")
    parser.add_argument("--round-timeout", type=float, default=30.0, help="synchronous round timeout, s")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--ready-file", type=Path, help="the port is written here once listening")
    args = parser.parse_args(argv)
    for name in ("shard", "checkpoint_every", "learners"):
        if getattr(args, name) < (0 if name == "shard" else 1):
            parser.error(f"--{name.replace('_', '-')} is out of range: {getattr(args, name)}")
    secret = os.environ.get(SECRET_ENV) or None
    try:
        sock = listen(args.host, args.port, secret)  # the port held from here on: torch is imported after it
    except ConfigError as exc:
        parser.error(str(exc))
    except OSError as exc:
        parser.exit(1, f"{parser.prog}: cannot listen on {args.host}:{args.port}: {exc}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch

    from labswarm.train.distributed.ps.server import (  # torch: after the checks, so they answer at once
        Shard,
        ShardServer,
    )

    torch.set_num_threads(1)
    shard = Shard(args.shard, args.learners, args.checkpoint_dir, args.checkpoint_every, args.round_timeout)
    server = ShardServer(shard, args.host, args.port, secret, sock=sock)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    print(f"listening on {args.host}:{server.port}", flush=True)
    if args.ready_file is not None:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(str(server.port))
        os.replace(tmp, args.ready_file)
    try:
        server.serve_forever()
    finally:
        shard.close()
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
