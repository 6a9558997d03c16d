"""A job's fingerprint, to reuse a finished training (issue 29, item 4).

``jobs.fingerprint``: :attr:`labswarm.train.provenance.Provenance.key` of the job (its configuration, data and
code), string(32), nullable (jobs before this revision, and jobs whose data could not be fingerprinted, have none:
they are never reused), indexed: ``POST /v1/jobs?reuse=true`` looks a completed job up by it.

Revision 0009 (after '0008').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("fingerprint", sa.String(32), nullable=True))
        batch.create_index("ix_jobs_fingerprint", ["fingerprint"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_fingerprint")
        batch.drop_column("fingerprint")
