"""Per-key budgets: reserve a request's maximum cost before any backend call, settle its real cost after.

    ledger = BudgetLedger(engine)
    reservation = ledger.reserve(key_id, max_cost_usd)    # raises BudgetExceeded before any backend call
    ledger.settle(reservation, actual_cost_usd)           # or ledger.release(reservation) on failure

Every update is one conditional UPDATE, so concurrent requests in many processes never pass a budget.
All methods block: call them from the event loop through `asyncio.to_thread`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, or_, select, update

from link.db.models import ApiKey, nano_to_usd, usd_to_nano
from link.keys import KeyNotFound


class BudgetExceeded(Exception):
    """The request's maximum cost does not fit in what is left of the key's budget."""

    def __init__(self, key_id: int, budget_usd: float, spend_usd: float, reserved_usd: float, max_cost_usd: float):
        self.key_id, self.budget_usd, self.spend_usd = key_id, budget_usd, spend_usd
        self.reserved_usd, self.max_cost_usd = reserved_usd, max_cost_usd
        super().__init__(f"budget of API key {key_id} exceeded: budget ${budget_usd:.6f}, spent ${spend_usd:.6f}, "
                         f"reserved by requests in flight ${reserved_usd:.6f}, this request may cost up to "
                         f"${max_cost_usd:.6f}")


@dataclass
class Reservation:
    """Money held for one request in flight, in integer nano-dollars; settled or released exactly once."""

    key_id: int
    amount_nusd: int
    is_open: bool = True

    @property
    def amount_usd(self) -> float:
        return nano_to_usd(self.amount_nusd)


class BudgetLedger:
    """Reserve a request's maximum cost before calling a backend; settle to the real cost afterwards.

    A reservation succeeds only when spend + reserved + max_cost <= budget, checked and applied by one
    conditional UPDATE, so concurrent requests (threads, processes, replicas sharing the database) can
    never jointly pass the budget; spend exceeds it only if a request's real cost exceeds its reserved
    maximum, by at most that request's cost. Keys without a budget are tracked (spend) but never refused.
    """

    def __init__(self, engine: Engine):
        self.engine = engine

    def reserve(self, key_id: int, max_cost_usd: float) -> Reservation:
        """Hold `max_cost_usd` (USD, >= 0) of key `key_id`'s budget.

        Raises:
            BudgetExceeded: it does not fit; nothing is held.
            KeyNotFound: no key with this id.
            ValueError: a negative cost.
        """
        if max_cost_usd < 0:
            raise ValueError(f"max_cost_usd must be >= 0, got {max_cost_usd}")
        amount = usd_to_nano(max_cost_usd)
        c = ApiKey.__table__.c
        stmt = (update(ApiKey.__table__)
                .where(c.id == key_id, or_(c.budget_nusd.is_(None), c.spend_nusd + c.reserved_nusd + amount <= c.budget_nusd))
                .values(reserved_nusd=c.reserved_nusd + amount))
        with self.engine.begin() as connection:
            if connection.execute(stmt).rowcount == 1:
                return Reservation(key_id, amount)
            row = connection.execute(select(c.budget_nusd, c.spend_nusd, c.reserved_nusd).where(c.id == key_id)).first()
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id}")
        raise BudgetExceeded(key_id, nano_to_usd(row.budget_nusd), nano_to_usd(row.spend_nusd),
                             nano_to_usd(row.reserved_nusd), max_cost_usd)

    def settle(self, reservation: Reservation, actual_cost_usd: float) -> None:
        """Replace the hold by the real cost (USD, >= 0): reserved -= held, spend += actual, atomically.

        Raises:
            ValueError: the reservation was already settled or released, or a negative cost.
        """
        if actual_cost_usd < 0:
            raise ValueError(f"actual_cost_usd must be >= 0, got {actual_cost_usd}")
        self._close(reservation, usd_to_nano(actual_cost_usd))

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
        c = ApiKey.__table__.c
        with self.engine.begin() as connection:
            connection.execute(update(ApiKey.__table__).where(c.id == reservation.key_id).values(
                reserved_nusd=c.reserved_nusd - reservation.amount_nusd, spend_nusd=c.spend_nusd + spend_nusd))


def max_cost_usd(prompt_tokens: int, max_completion_tokens: int, input_cost_per_million: float,
                 output_cost_per_million: float) -> float:
    """Upper bound of a request's cost in USD: every prompt token plus the most completion tokens allowed."""
    return (prompt_tokens * input_cost_per_million + max_completion_tokens * output_cost_per_million) / 1e6
