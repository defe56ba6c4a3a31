"""The request log's `caller`: how each request authenticated (a stored key, the master key, or open mode), so
that neither a 401 refusal nor an open-mode request reads as the master key's (both have no api_key_id).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-17
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Older rows keep a null caller: whether a keyless one was the master key's or open mode's is not known.
    op.add_column("request_log", sa.Column("caller", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("caller")
