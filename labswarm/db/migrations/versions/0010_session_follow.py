"""A session that follows its catalog (issue 27, item 4).

``sessions.follow``: boolean, not null, default false. A followed session publishes the rows appended to its
labels CSV as they appear and ends only when cancelled (:mod:`labswarm.sessions.follow`); the sessions before
this revision follow nothing.

Revision 0010 (after '0009').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("follow", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("follow")
