"""Who holds each budget reservation, and releasing the holds of gateway processes that died.

    with engine.begin() as connection:
        now = database_now(connection)
        released = release_holds(connection, now)               # of owners whose lease expired (or who have none)
        released = release_holds(connection, now, owner=owner)  # at start-up: a killed predecessor's, by its id
        renew_lease(connection, owner, now, lease_s)

The rule. A reservation of a process that died (kill -9, a crash: it never settled) must not stay held, or the
key's next request that fits its unspent budget is refused; one held by a live replica must never be released by
another replica.
1. Every `BudgetLedger` is an owner: its `LINK_INSTANCE_ID` when set, else an id fresh per process. It holds a
   lease in `budget_lease` that expires `lease_s` after its last renewal, on the database's clock (every replica
   reads the same one, so their own clocks may drift), and renews it every lease_s / 3 while it runs (the
   gateway's heartbeat task, `link.budgets.keep_lease`).
2. Each `budget_reservation` row names its owner. Rows whose owner's lease has expired, or whose owner has none
   (closed cleanly, or never renewed), are released: deleted, and their amounts taken off
   `api_key.reserved_nusd` in the same transaction. Every replica does this at start-up and on each heartbeat.
3. At start-up a ledger also releases the rows under its own owner id: with LINK_INSTANCE_ID set they belong to
   a predecessor of the same name that was killed (two live replicas must never share an id), so a restart frees
   them at once instead of after the lease.
4. A live process whose heartbeat stalls for more than lease_s loses its holds to rule 2 (its requests in flight
   may then spend past a budget by what they held). Its settles find their rows gone and only add the spend:
   nothing is ever released twice.
Releases take a PostgreSQL advisory lock first (SQLite serializes writers anyway), so two replicas releasing at
once wait for each other instead of deadlocking on the rows they both delete.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections import defaultdict

from sqlalchemy import Connection, delete, extract, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from link.db.ledger import BudgetLease, BudgetReservation
from link.db.models import ApiKey

DEFAULT_LEASE_S = 30.0
# Arbitrary 64-bit constant naming the ledger's lock among PostgreSQL advisory locks ("ldgr" in ASCII).
LEDGER_LOCK_ID = 0x6C646772
UNIX_EPOCH_JULIAN_DAY = 2440587.5


def new_owner_id() -> str:
    """An owner id unique to this process: "<host>-<pid>-<8 hex digits>" (at most 82 characters)."""
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def database_now(connection: Connection) -> float:
    """Seconds since the epoch on the database server's clock (the one clock all replicas share)."""
    if connection.dialect.name == "postgresql":
        now = extract("epoch", func.clock_timestamp())
    else:
        now = (func.julianday("now") - UNIX_EPOCH_JULIAN_DAY) * 86400.0
    return float(connection.execute(select(now)).scalar_one())


def renew_lease(connection: Connection, owner: str, now: float, lease_s: float) -> bool:
    """Extend (or take) `owner`'s lease to `now + lease_s`. Returns False when it had expired or did not exist."""
    table = BudgetLease.__table__
    expires_at = now + lease_s
    renewed = connection.execute(update(table).where(table.c.owner == owner, table.c.expires_at >= now)
                                 .values(expires_at=expires_at)).rowcount == 1
    if not renewed:
        insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
        stmt = insert(table).values(owner=owner, expires_at=expires_at)
        connection.execute(stmt.on_conflict_do_update(index_elements=["owner"], set_={"expires_at": expires_at}))
    return renewed


def release_holds(connection: Connection, now: float, *, owner: str | None = None) -> tuple[int, int]:
    """Release reservations (rule 2; with `owner`: that owner's, rule 3) and drop expired leases (rule 2).

    Returns:
        (reservations released, nano-dollars given back to their keys).
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": LEDGER_LOCK_ID})
    holds, leases, keys = BudgetReservation.__table__, BudgetLease.__table__, ApiKey.__table__
    if owner is None:
        is_dead = holds.c.owner.not_in(select(leases.c.owner).where(leases.c.expires_at >= now))
    else:
        is_dead = holds.c.owner == owner
    released = connection.execute(delete(holds).where(is_dead).returning(holds.c.api_key_id, holds.c.amount_nusd)).all()
    per_key: dict[int, int] = defaultdict(int)
    for key_id, amount in released:
        per_key[key_id] += amount
    for key_id in sorted(per_key):
        connection.execute(update(keys).where(keys.c.id == key_id).values(reserved_nusd=keys.c.reserved_nusd - per_key[key_id]))
    if owner is None:
        connection.execute(delete(leases).where(leases.c.expires_at < now))
    return len(released), sum(per_key.values())


def drop_lease(connection: Connection, owner: str) -> None:
    """Remove `owner`'s lease (a clean shutdown); any holds left under it are then released by rule 2."""
    connection.execute(delete(BudgetLease.__table__).where(BudgetLease.__table__.c.owner == owner))
