"""Learners as docker swarm services (issue 12, item 5).

``job_learners.service_id``: the id of the swarm service that runs the learner (``job_launcher: swarm``,
:mod:`labswarm.deploy.swarm_learners`), string(64), nullable: a local learner has a pid instead, and the rows that
exist before this revision are all local.

Revision 0007 (after '0006').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_learners") as batch:
        batch.add_column(sa.Column("service_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_learners") as batch:
        batch.drop_column("service_id")
