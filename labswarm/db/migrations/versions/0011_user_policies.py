"""The users' weights and quotas an admin sets over the API (issue 26, item 1).

``user_policies``: one row per user with overrides: ``user`` (primary key, at most 64 characters), ``weight``
(float, null: not overridden), ``quotas`` (JSON object: the quotas overridden by name, a null value meaning no
quota), ``updated_by`` (the admin), ``updated_at``. No rows before this revision: every user keeps what the
settings and the tokens file give them (:mod:`labswarm.auth.quotas`).

Revision 0011 (after '0010').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_policies",
        sa.Column("user", sa.String(64), primary_key=True),
        sa.Column("weight", sa.Float(), nullable=True),
        sa.Column("quotas", sa.JSON(), nullable=False),
        sa.Column("updated_by", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("user_policies")
