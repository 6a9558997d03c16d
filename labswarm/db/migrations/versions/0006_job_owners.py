"""Owners of training jobs and their attempts' own tokens (issue 11, item 2; issue 12).

``jobs.owner``: the user who submitted the job (string(64), not null, indexed: the list filters on it). Rows that
exist before this revision get ``admin``, the default revision 0005 gives experiments and sessions (the reserved
user of ``LABSWARM_API_TOKEN``): they stay visible to admins only. The server default stays ``admin``.

``job_attempts.token_sha256``: the hex SHA-256 of the token an attempt's learners report with (nullable: older
attempts have none; their learners report with ``LABSWARM_API_TOKEN``, an admin's).

Revision 0006 (after '0005').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: The owner of the jobs that exist before this revision (and the column's server default): 0005's default.
DEFAULT_OWNER = "admin"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(64), server_default=DEFAULT_OWNER, nullable=False))
    op.create_index("ix_jobs_owner", "jobs", ["owner"])
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("token_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("token_sha256")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("owner")
