"""The request log's `instance`: the gateway process that served each request (its LINK_INSTANCE_ID, "-w<i>" for
worker i of `link serve --workers N`, else an id fresh per process), to tell replicas and workers apart.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-19
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Older rows keep a null instance: which process served them was not recorded.
    op.add_column("request_log", sa.Column("instance", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("instance")
