"""Console sessions: the `console_session` table, which makes a console login revocable.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "console_session",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("last_seen_at", TIME, nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
        sa.Column("revoked_at", TIME, nullable=True),
        sa.Column("flash", sa.JSON(), nullable=True),
    )
    op.create_index("ix_console_session_expires_at", "console_session", ["expires_at"])


def downgrade() -> None:
    op.drop_table("console_session")
