"""Eval tables: run records, the response cache and stored reports (`link eval`).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "eval_run",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("suite", sa.String(64), nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("targets", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("totals", sa.JSON(), nullable=True),
        sa.Column("outcomes_path", sa.Text(), nullable=True),
    )
    op.create_index("ix_eval_run_suite", "eval_run", ["suite"])
    op.create_index("ix_eval_run_created_at", "eval_run", ["created_at"])

    op.create_table(
        "eval_cache",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("suite", sa.String(64), nullable=False),
        sa.Column("item_id", sa.String(512), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
    )
    op.create_index("ix_eval_cache_target", "eval_cache", ["target"])

    op.create_table(
        "eval_report",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("title", sa.String(512), nullable=False),
        sa.Column("run_ids", sa.JSON(), nullable=False),
        sa.Column("markdown", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("png", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
    )
    op.create_index("ix_eval_report_created_at", "eval_report", ["created_at"])


def downgrade() -> None:
    op.drop_table("eval_report")
    op.drop_table("eval_cache")
    op.drop_table("eval_run")
