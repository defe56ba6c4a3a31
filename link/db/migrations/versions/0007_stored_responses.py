"""Stored responses of the Responses API: the `stored_response` table (link/db/responses.py).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-18
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "stored_response",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("api_key_id", sa.Integer(), sa.ForeignKey("api_key.id", ondelete="CASCADE"), nullable=True),
        sa.Column("caller", sa.String(16), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=False),
    )
    for column in ("created_at", "api_key_id"):
        op.create_index(f"ix_stored_response_{column}", "stored_response", [column])


def downgrade() -> None:
    op.drop_table("stored_response")
