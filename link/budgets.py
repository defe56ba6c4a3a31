"""Per-key budgets: reserve a request's maximum cost before any backend call, settle its real cost after.

    ledger = BudgetLedger(engine, owner="gw-1")           # owner: LINK_INSTANCE_ID, else an id per process
    ledger.open()                                         # start-up: release holds of processes that died
    reservation = ledger.reserve(key_id, max_cost_usd)    # raises BudgetExceeded before any backend call
    ledger.settle(reservation, actual_cost_usd)           # or ledger.release(reservation) on failure
    ledger.heartbeat()                                    # every lease_s / 3 (keep_lease, the gateway's heartbeat task)
    ledger.close()                                        # shutdown: release what is left, drop the lease

Why it is exact across processes. The database is the only place a budget's state lives: no process keeps a share
of a budget in memory. A reservation is one transaction whose conditional UPDATE checks "what is left >= this
request's maximum" and adds the hold in the same statement, so concurrent requests in any number of workers or
replicas are serialized by the database's row lock and can never jointly pass the budget; its `budget_reservation`
row (same transaction) names its owner, so the holds of a process killed before it settled them are released at the
next start-up or heartbeat of any replica, never those of a live one (the rule is in link/budget_leases.py). A settle
is one transaction too (delete the hold's row, move its amount from reserved to spend), committed before the caller
goes on: the gateway settles a whole answer before sending it, so its spend is visible to every worker at once and
survives a `kill -9` that follows. (Settles are deliberately not deferred or batched: a hold kept after its answer
would make another worker refuse a request that fits, and a crash would lose the spend of answered requests.)
Each request's statements run on the driver's cursor, compiled once per engine (link/db/driver.py): the same SQL
SQLAlchemy would send, for about an eighth of the CPU.
Amounts are integer nano-dollars in BIGINT columns; the ledger never computes or stores one they cannot
represent: a cost is held as at most MAX_HOLD_NUSD (just above the largest budget a key can have, so it
still fits no budget), the holds of a key without a budget stop at the column's range (a refusal, not
an overflow), and spend saturates there. All methods block: call them from the event loop through
`asyncio.to_thread` (the gateway's reserve and settle: `link.blocking_calls.BlockingCalls`, the same at less CPU).

While the database does not answer, `reserve` raises `LedgerUnavailable` (the gateway refuses a key with a budget:
fail closed), and a `settle` or `release` is kept in memory and applied by the next `heartbeat` (or `close`) that
reaches the database, so a hold taken before an outage is neither lost nor left held. The kept closings are the
reservations open when the database went away (no new hold is taken while it is away) and the spend of keys without
a budget answered meanwhile (`Reservation.unheld`); these last stop at MAX_UNAPPLIED, past which such a spend is
logged and not counted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import BigInteger, Engine, and_, bindparam, case, delete, insert, or_, select, update

from link.budget_leases import DEFAULT_LEASE_S, database_now, drop_lease, new_owner_id, release_holds, renew_lease
from link.db.driver import DriverStatement, driver_transaction
from link.db.engine import is_unreachable, unreachable_cause
from link.db.ledger import BudgetReservation
from link.db.models import MAX_BUDGET_USD, ApiKey, nano_to_usd, usd_to_nano, utcnow
from link.keys import KeyNotFound

logger = logging.getLogger(__name__)

MAX_NUSD = 2**63 - 1  # the BIGINT range of the ledger's columns (SQLite's INTEGER and PostgreSQL's BIGINT)
# The most one request holds or spends: one nano-dollar above the largest budget the API accepts, so a cost
# at or beyond it fits no budget, and nine such holds still add up inside MAX_NUSD.
MAX_HOLD_NUSD = usd_to_nano(MAX_BUDGET_USD) + 1
MAX_UNAPPLIED = 100_000  # closings kept while the database is unreachable, at most (holds are always kept)


def ledger_nano(usd: float, what: str) -> int:
    """An amount in USD as the ledger's nano-dollars: rounded, capped at MAX_HOLD_NUSD (infinity too).

    Raises:
        ValueError: NaN or a negative amount; `what` names it in the message.
    """
    if math.isnan(usd) or usd < 0:
        raise ValueError(f"{what} must be a number >= 0, got {usd}")
    return MAX_HOLD_NUSD if usd >= MAX_BUDGET_USD else min(usd_to_nano(usd), MAX_HOLD_NUSD)


class BudgetExceeded(Exception):
    """The request's maximum cost does not fit in what is left of the key's budget. A key without a budget is refused
    only when its requests in flight already hold nearly all the ledger can represent (`is_ledger_full`); its
    `budget_usd` is then that capacity."""

    def __init__(self, key_id: int, budget_usd: float, spend_usd: float, reserved_usd: float, max_cost_usd: float,
                 *, is_ledger_full: bool = False):
        self.key_id, self.budget_usd, self.spend_usd = key_id, budget_usd, spend_usd
        self.reserved_usd, self.max_cost_usd, self.is_ledger_full = reserved_usd, max_cost_usd, is_ledger_full
        if is_ledger_full:
            super().__init__(f"API key {key_id} has no budget, but its requests in flight hold ${reserved_usd:.6f} and "
                             f"this request may cost up to ${max_cost_usd:.6f}: more than the ledger holds for one key "
                             f"(${budget_usd:.6f})")
            return
        super().__init__(f"budget of API key {key_id} exceeded: budget ${budget_usd:.6f}, spent ${spend_usd:.6f}, "
                         f"reserved by requests in flight ${reserved_usd:.6f}, this request may cost up to "
                         f"${max_cost_usd:.6f}")


class LedgerUnavailable(Exception):
    """The ledger's database did not answer (refused, dropped, restarting); the message names the driver's cause.
    Nothing was held."""


@dataclass
class Reservation:
    """Money held for one request in flight, in integer nano-dollars; settled or released exactly once."""

    key_id: int
    amount_nusd: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)  # its budget_reservation row
    is_open: bool = True

    @property
    def amount_usd(self) -> float:
        return nano_to_usd(self.amount_nusd)

    @classmethod
    def unheld(cls, key_id: int) -> Reservation:
        """A reservation that holds nothing (no `budget_reservation` row): settling it only adds the spend. What a
        key without a budget is given while the ledger is unavailable, so its spend is still counted afterwards."""
        return cls(key_id, 0)


class BudgetLedger:
    """Reserve a request's maximum cost before calling a backend; settle to the real cost afterwards.

    A reservation succeeds only when spend + reserved + max_cost <= budget, checked and applied by one
    conditional UPDATE, so concurrent requests (threads, processes, replicas sharing the database) can
    never jointly pass the budget; spend exceeds it only if a request's real cost exceeds its reserved
    maximum, by at most that request's cost. Keys without a budget are tracked (spend) and refused only
    when their holds would leave the BIGINT range (see the module docstring).

    Args:
        engine: the gateway's database.
        owner: the owner id its reservations carry (`LINK_INSTANCE_ID`: stable across restarts, so a restart
            releases a killed predecessor's holds at once); None: a fresh id for this process.
        lease_s: seconds this owner's holds outlive its last lease renewal (`heartbeat`, or a `reserve` once a
            third of it has passed).
    """

    def __init__(self, engine: Engine, *, owner: str | None = None, lease_s: float = DEFAULT_LEASE_S):
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.engine, self.owner, self.lease_s = engine, owner or new_owner_id(), float(lease_s)
        self._renew_at = 0.0  # time.monotonic() when the lease is next due for renewal; 0: not taken yet
        self._unapplied: list[tuple[Reservation, int]] = []  # settles/releases the database missed (spend, nusd)
        self._unapplied_lock = threading.Lock()
        self._sql = _LedgerSQL(engine)

    def open(self) -> tuple[int, int]:
        """Start-up: release the holds left under this owner id and those of owners whose lease expired, and take
        this owner's lease (rules 2 and 3 of link/budget_leases.py).

        Returns:
            (reservations released, nano-dollars given back).
        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database is unreachable.
        """
        with self.engine.begin() as connection:
            now = database_now(connection)
            own = release_holds(connection, now, owner=self.owner)
            others = release_holds(connection, now)
            renew_lease(connection, self.owner, now, self.lease_s)
        self._renew_at = time.monotonic() + self.lease_s / 3
        released = (own[0] + others[0], own[1] + others[1])
        if released[0]:
            logger.warning("budget ledger %s: released %d reservations ($%.6f) of gateway processes that stopped "
                           "without settling them", self.owner, released[0], nano_to_usd(released[1]))
        return released

    def heartbeat(self) -> tuple[int, int]:
        """Apply the settles and releases the database missed while it was away, renew this owner's lease and release
        the holds of owners whose lease expired (rule 2); returns what was released, as `open`. Raises
        sqlalchemy.exc.SQLAlchemyError when the database is unreachable (the missed closings are kept)."""
        self.apply_unapplied()
        with self.engine.begin() as connection:
            now = database_now(connection)
            released = release_holds(connection, now)
            was_live = renew_lease(connection, self.owner, now, self.lease_s)
        if not was_live and self._renew_at:
            logger.warning("budget ledger %s: its lease had expired (no renewal for %.0f s), so other replicas may "
                           "have released its holds", self.owner, self.lease_s)
        self._renew_at = time.monotonic() + self.lease_s / 3
        if released[0]:
            logger.warning("budget ledger %s: released %d reservations ($%.6f) of gateway processes whose lease "
                           "expired", self.owner, released[0], nano_to_usd(released[1]))
        return released

    def close(self) -> None:
        """Shutdown: apply the closings the database missed, release the holds still open under this owner (requests
        that never settled) and drop its lease."""
        self.apply_unapplied()
        with self.engine.begin() as connection:
            release_holds(connection, database_now(connection), owner=self.owner)
            drop_lease(connection, self.owner)
        self._renew_at = 0.0

    def _renew_if_due(self) -> None:
        # A ledger without a heartbeat task (a script, a test) still holds a lease while it keeps reserving.
        if time.monotonic() < self._renew_at:
            return
        with self.engine.begin() as connection:
            renew_lease(connection, self.owner, database_now(connection), self.lease_s)
        self._renew_at = time.monotonic() + self.lease_s / 3

    def reserve(self, key_id: int, max_cost_usd: float) -> Reservation:
        """Hold `max_cost_usd` (USD, >= 0; infinity and anything from MAX_BUDGET_USD up are held as MAX_HOLD_NUSD,
        which fits no budget) of key `key_id`'s budget.

        Raises:
            BudgetExceeded: it does not fit; nothing is held.
            KeyNotFound: no key with this id.
            LedgerUnavailable: the database did not answer; nothing is held.
            ValueError: a negative cost or NaN.
        """
        amount = ledger_nano(max_cost_usd, "max_cost_usd")
        try:
            return self._reserve(key_id, amount, max_cost_usd)
        except Exception as exc:
            if is_unreachable(exc):
                raise LedgerUnavailable(f"the budget ledger's database is unreachable: {unreachable_cause(exc)}") from exc
            raise

    def _reserve(self, key_id: int, amount: int, max_cost_usd: float) -> Reservation:
        self._renew_if_due()
        sql = self._sql
        with driver_transaction(self.engine) as cursor:
            if sql.hold.execute(cursor, key_id=key_id, amount=amount, room=MAX_NUSD - amount) == 1:
                reservation = Reservation(key_id, amount)
                sql.add_hold.execute(cursor, id=reservation.id, api_key_id=key_id, owner=self.owner, amount_nusd=amount,
                                     created_at=utcnow())
                return reservation
            row = sql.totals.fetch_one(cursor, key_id=key_id)
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id}")
        budget_nusd, spend_nusd, reserved_nusd = row
        is_ledger_full = budget_nusd is None
        raise BudgetExceeded(key_id, nano_to_usd(MAX_NUSD if is_ledger_full else budget_nusd),
                             nano_to_usd(spend_nusd), nano_to_usd(reserved_nusd), max_cost_usd,
                             is_ledger_full=is_ledger_full)

    def settle(self, reservation: Reservation, actual_cost_usd: float) -> None:
        """Replace the hold by the real cost (USD, >= 0, capped at MAX_HOLD_NUSD like a hold): reserved -= held,
        spend += actual (saturating at MAX_NUSD), atomically. A hold already released because this owner's lease
        expired (link/budget_leases.py, rule 4) is not given back twice: only the spend is added.
        While the database is unreachable the closing is kept in memory and applied by a later `heartbeat`.

        Raises:
            ValueError: the reservation was already settled or released, or a negative cost or NaN.
        """
        self._close(reservation, ledger_nano(actual_cost_usd, "actual_cost_usd"))

    def release(self, reservation: Reservation) -> None:
        """Give the hold back without spending (the request failed before costing anything).

        Raises:
            ValueError: the reservation was already settled or released.
        """
        self._close(reservation, 0)

    def _close(self, reservation: Reservation, spend_nusd: int) -> None:
        if not reservation.is_open:
            raise ValueError(f"reservation of key {reservation.key_id} was already settled or released")
        reservation.is_open = False
        try:
            self._apply_close(reservation, spend_nusd)
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            with self._unapplied_lock:
                num_kept = len(self._unapplied)
                if reservation.amount_nusd == 0 and num_kept >= MAX_UNAPPLIED:
                    logger.error("budget ledger %s: %d settlements wait for the database already; the spend of key "
                                 "%d (%d nano-dollars) is not counted", self.owner, num_kept, reservation.key_id,
                                 spend_nusd)
                    return
                self._unapplied.append((reservation, spend_nusd))
                num_kept += 1
            logger.warning("budget ledger %s: the database is unreachable (%s); settling key %d's reservation is kept "
                           "in memory (%d kept) until it answers", self.owner, unreachable_cause(exc),
                           reservation.key_id, num_kept)

    def apply_unapplied(self) -> int:
        """Apply the settles and releases kept while the database was unreachable, oldest first; returns how many were
        applied. Stops at the first that fails again (kept, with the rest). Raises what a statement error raises."""
        with self._unapplied_lock:
            kept, self._unapplied = self._unapplied, []
        applied = 0
        try:
            for reservation, spend_nusd in kept:
                self._apply_close(reservation, spend_nusd)
                applied += 1
        finally:
            with self._unapplied_lock:
                self._unapplied[:0] = kept[applied:]
        if applied:
            logger.warning("budget ledger %s: the database answers again; applied %d settlements kept meanwhile",
                           self.owner, applied)
        return applied

    @property
    def num_unapplied(self) -> int:
        """Settles and releases waiting for the database to answer."""
        return len(self._unapplied)

    def _apply_close(self, reservation: Reservation, spend_nusd: int) -> None:
        sql = self._sql
        with driver_transaction(self.engine) as cursor:
            is_held = sql.drop_hold.execute(cursor, reservation_id=reservation.id) == 1
            sql.close.execute(cursor, key_id=reservation.key_id, released=reservation.amount_nusd if is_held else 0,
                              spend=spend_nusd, spend_room=MAX_NUSD - spend_nusd, max_nusd=MAX_NUSD)


class _LedgerSQL:
    """The ledger's per-request statements, compiled once for one engine (link/db/driver.py says why).

    hold:      api_key.reserved_nusd += amount where it fits (the one conditional UPDATE of the module docstring);
               written as "room >= amount" rather than "spend + reserved + amount <= budget", so the database never
               adds up a sum beyond BIGINT (PostgreSQL raises on overflow): budgets are at most MAX_BUDGET_USD, so a
               budgeted key's room stays in range, and an unbudgeted key's holds stop below MAX_NUSD (`room`).
    add_hold:  its budget_reservation row, in the same transaction.
    totals:    budget, spend and reserved of a key, for a refusal's message.
    drop_hold: delete a reservation's row (rowcount 0: already released under rule 4 of link/budget_leases.py).
    close:     reserved -= released, spend += spend saturating at MAX_NUSD (`spend_room` = MAX_NUSD - spend).
    """

    def __init__(self, engine: Engine):
        keys, holds = ApiKey.__table__, BudgetReservation.__table__
        c = keys.c
        key_id = bindparam("key_id", type_=keys.c.id.type)
        amount, room = bindparam("amount", type_=BigInteger), bindparam("room", type_=BigInteger)
        fits = or_(c.budget_nusd - c.spend_nusd - c.reserved_nusd >= amount,
                   and_(c.budget_nusd.is_(None), c.reserved_nusd <= room))
        self.hold = DriverStatement(engine, update(keys).where(c.id == key_id, fits)
                                    .values(reserved_nusd=c.reserved_nusd + amount))
        self.add_hold = DriverStatement(engine, insert(holds))
        self.totals = DriverStatement(engine, select(c.budget_nusd, c.spend_nusd, c.reserved_nusd).where(c.id == key_id))
        self.drop_hold = DriverStatement(engine, delete(holds).where(holds.c.id == bindparam("reservation_id")))
        spend, spend_room = bindparam("spend", type_=BigInteger), bindparam("spend_room", type_=BigInteger)
        self.close = DriverStatement(engine, update(keys).where(c.id == key_id).values(
            reserved_nusd=c.reserved_nusd - bindparam("released", type_=BigInteger),
            spend_nusd=case((c.spend_nusd > spend_room, bindparam("max_nusd", type_=BigInteger)),
                            else_=c.spend_nusd + spend)))


def max_cost_usd(prompt_tokens: int, max_completion_tokens: int, input_cost_per_million: float,
                 output_cost_per_million: float) -> float:
    """Upper bound of a request's cost in USD: every prompt token plus the most completion tokens allowed."""
    return (prompt_tokens * input_cost_per_million + max_completion_tokens * output_cost_per_million) / 1e6


async def keep_lease(ledger: BudgetLedger, interval_s: float) -> None:
    """Run `ledger.heartbeat()` every `interval_s` seconds until cancelled (the gateway's heartbeat task); a failed
    beat (the database unreachable) is logged and the next one tries again."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(ledger.heartbeat)
        except Exception:
            logger.warning("budget ledger %s: renewing its lease failed; retrying in %.1f s", ledger.owner, interval_s,
                           exc_info=True)
