"""Tables of the budget ledger's reservations (SQLModel), beside the totals on `api_key` (link/budgets.py).

    budget_reservation  one hold of a request in flight: key, amount (nano-dollars), the owner that holds it
    budget_lease        one owner (a gateway process's ledger) and when its claim to be alive expires

`api_key.reserved_nusd` is always the sum of its key's `budget_reservation` amounts: both change in the same
transaction. Lease times are epoch seconds on the database's clock, which every replica shares (link/budget_leases.py
has the rule). Created by migration 0005.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger
from sqlmodel import Field, SQLModel

from link.db.models import time_column


class BudgetReservation(SQLModel, table=True):
    """Money held for one request in flight; deleted when it is settled or released."""

    __tablename__ = "budget_reservation"

    id: str = Field(primary_key=True, max_length=32, description="uuid4 hex")
    api_key_id: int = Field(foreign_key="api_key.id", index=True, ondelete="CASCADE")
    owner: str = Field(max_length=128, index=True, description="the budget_lease owner holding it")
    amount_nusd: int = Field(sa_type=BigInteger, description="nano-dollars held")
    created_at: datetime = time_column()


class BudgetLease(SQLModel, table=True):
    """A ledger owner's lease: its reservations count as held while `expires_at` is in the future."""

    __tablename__ = "budget_lease"

    owner: str = Field(primary_key=True, max_length=128)
    expires_at: float = Field(description="epoch seconds, database clock")
