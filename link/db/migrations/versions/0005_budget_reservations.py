"""Budget reservations: one row per hold with its owner, and the owners' leases, so the holds of a gateway
process that died (kill -9) are released at start-up instead of staying reserved forever.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-16
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budget_reservation",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("api_key_id", sa.Integer(), sa.ForeignKey("api_key.id", ondelete="CASCADE"), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("amount_nusd", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_budget_reservation_api_key_id", "budget_reservation", ["api_key_id"])
    op.create_index("ix_budget_reservation_owner", "budget_reservation", ["owner"])
    op.create_table(
        "budget_lease",
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    # Holds taken before this revision have no row: they stay in api_key.reserved_nusd until the (older) process
    # that took them settles them. They are not zeroed here: during a rolling upgrade an older replica may still
    # hold some, and its settle would then leave the key's total negative for good.


def downgrade() -> None:
    op.drop_table("budget_lease")
    op.drop_table("budget_reservation")
