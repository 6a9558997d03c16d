"""Alembic's environment for labswarm: migrations run on the connection :mod:`labswarm.db.migrate` passes in.

There is no offline (SQL script) mode and no URL here: ``labswarm.db.migrate.upgrade`` owns the connection, the
transaction and the lock around it.
"""

from __future__ import annotations

from alembic import context

from labswarm.db.engine import Base
from labswarm.db.migrate import import_tables

import_tables()

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("labswarm's migrations run through labswarm.db.migrate (python -m labswarm.db.migrate)")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
