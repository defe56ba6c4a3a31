"""Initial schema: API keys, policies, models, the request log and rate-limit counters.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_key",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("rpm_limit", sa.Integer(), nullable=True),
        sa.Column("tpm_limit", sa.Integer(), nullable=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("key_prefix", sa.String(32), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("revoked_at", TIME, nullable=True),
        sa.Column("budget_nusd", sa.BigInteger(), nullable=True),
        sa.Column("spend_nusd", sa.BigInteger(), nullable=False),
        sa.Column("reserved_nusd", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_api_key_name", "api_key", ["name"])

    op.create_table(
        "policy",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
    )

    op.create_table(
        "model",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
    )
    op.create_index("ix_model_name", "model", ["name"])

    op.create_table(
        "request_log",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("api_key_id", sa.Integer(), sa.ForeignKey("api_key.id", ondelete="SET NULL"), nullable=True),
        sa.Column("policy", sa.String(128), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("deployment", sa.String(256), nullable=True),
        sa.Column("decision", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("user", sa.String(256), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=True),
    )
    for column in ("created_at", "api_key_id", "policy", "model", "status"):
        op.create_index(f"ix_request_log_{column}", "request_log", [column])

    op.create_table(
        "rate_limit_counter",
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("window_start", sa.BigInteger(), primary_key=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rate_limit_counter")
    op.drop_table("request_log")
    op.drop_table("model")
    op.drop_table("policy")
    op.drop_table("api_key")
