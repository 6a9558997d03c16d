"""Owners of experiments and sessions (issue 11, item 2): who registered an experiment, who started a session.

``experiments.owner`` and ``sessions.owner``: a user name (:data:`labswarm.auth.tokens.NAME`, at most 64
characters), not null, indexed (listing routes filter on it). Rows that exist before this revision get the owner
``admin``: the user of ``LABSWARM_API_TOKEN``, a reserved name no tokens file can take, so they stay visible to
admins only (an admin sees everything; ``local``, the open loopback manager's caller, is an admin too). The server
default stays ``admin`` afterwards, for rows written by code that names no owner.

Revision 0005 (after '0004').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

#: The owner of the rows that exist before this revision (and the column's server default).
DEFAULT_OWNER = "admin"
TABLES = ("experiments", "sessions")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("owner", sa.String(64), server_default=DEFAULT_OWNER, nullable=False))
        op.create_index(f"ix_{table}_owner", table, ["owner"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_owner", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("owner")
