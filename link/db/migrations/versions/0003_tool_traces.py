"""Tool-call traces: the `tool_trace` table and the `capture_traces` opt-in of API keys.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-14
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Existing keys keep recording nothing: the server default fills the new column with false.
    op.add_column("api_key", sa.Column("capture_traces", sa.Boolean(), nullable=False, server_default=sa.false()))

    op.create_table(
        "tool_trace",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("api_key_id", sa.Integer(), sa.ForeignKey("api_key.id", ondelete="SET NULL"), nullable=True),
        sa.Column("policy", sa.String(128), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=False),
        sa.Column("tools", sa.JSON(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=True),
    )
    for column in ("created_at", "api_key_id", "policy"):
        op.create_index(f"ix_tool_trace_{column}", "tool_trace", [column])


def downgrade() -> None:
    op.drop_table("tool_trace")
    with op.batch_alter_table("api_key") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("capture_traces")
