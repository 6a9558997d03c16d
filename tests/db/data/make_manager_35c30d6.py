"""Makes ``manager-35c30d6.sqlite``: a manager database as the code of commit 35c30d6 wrote it (tables made by
``create_all``, no ``alembic_version``), for tests/db/test_upgrade.py.

Run it with that commit's code first on the path, e.g.::

    git worktree add /tmp/old 35c30d6
    PYTHONPATH=/tmp/old .venv/bin/python tests/db/data/make_manager_35c30d6.py tests/db/data/manager-35c30d6.sqlite

Rows: one experiment ``legacy``, one running session ``legacy0001`` (cursor 3, published 3) and its three ledger
rows (``a`` done, ``b`` failed with a reason, ``c`` cached). Times are fixed so that the file is reproducible.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

from labswarm.manager.db import ExperimentRow, SampleRow, SessionRow, make_engine, make_sessionmaker

import labswarm
from labswarm.config.experiment import parse_experiment

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def main(path: Path) -> None:
    if not Path(labswarm.__file__).parent.joinpath("manager", "db.py").exists():
        raise SystemExit(f"{labswarm.__file__}: not the code of 35c30d6 (no labswarm/manager/db.py)")
    path.unlink(missing_ok=True)
    config = parse_experiment({
        "name": "legacy", "seed": 0,
        "dataset": {"root": "/data/legacy", "sample_rate": 16000, "segment": {"start": 0.0, "duration": 2.0}},
        "transformations": [{"name": "identity"}],
        "features": [{"name": "mel", "n_mels": 32}],
        "store": {"root": "/store/legacy"},
    })
    engine = make_engine(f"sqlite:///{path}")
    with make_sessionmaker(engine)() as db:
        db.add(ExperimentRow(name="legacy", config=config.model_dump(mode="json"), fingerprint=config.fingerprint(),
                             created_at=T0, updated_at=T0))
        db.flush()
        db.add(SessionRow(id="legacy0001", experiment="legacy", status="running", rate=5.0, weight=2.0, total=3,
                          cursor=3, published=3, fingerprint=config.fingerprint(), created_at=T0, started_at=T0))
        db.flush()
        db.add_all([
            SampleRow(session_id="legacy0001", sample_id="a", status="done", seconds=0.25, finished_at=1.5e9,
                      updated_at=T0),
            SampleRow(session_id="legacy0001", sample_id="b", status="failed", reason="AudioError: b.wav: unreadable",
                      attempts=3, updated_at=T0),
            SampleRow(session_id="legacy0001", sample_id="c", status="cached", updated_at=T0),
        ])
        db.commit()
    engine.dispose()
    print(f"wrote {path} with {labswarm.__file__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
