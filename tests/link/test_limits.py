"""link.limits and link.budgets: rate limits (database and Redis counters) and budgets, also under concurrency and across
processes, on SQLite and PostgreSQL.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_limits.py
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from link.db.models import usd_to_nano
from link.keys import MASTER_IDENTITY, KeyIdentity, KeyNotFound, create_key, get_key
from link.limits import BudgetExceeded, BudgetLedger, RateLimited, RateLimiter, max_cost_usd

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0  # a window boundary for 60 s windows (divisible by 60)


class FakeClock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["database", "redis"])
def make_limiter(request, engine, unique_prefix):
    """make_limiter(window, clock) -> RateLimiter with counters in the test database or in Redis."""
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    limiters = []

    def make(window: str = "fixed", clock=None) -> RateLimiter:
        limiter = RateLimiter(engine, redis_url=redis_url, window=window, prefix=unique_prefix,
                              clock=clock or FakeClock())
        limiters.append(limiter)
        return limiter

    yield make
    for limiter in limiters:
        limiter.close()


def _key(key_id: int = 1, rpm: int | None = None, tpm: int | None = None) -> KeyIdentity:
    return KeyIdentity(key_id=key_id, name="k", rpm_limit=rpm, tpm_limit=tpm)


# --- rate limits --------------------------------------------------------------------------------


def test_fixed_window_requests_per_minute(make_limiter):
    clock = FakeClock(T0 + 15)
    limiter = make_limiter("fixed", clock)
    key = _key(rpm=3)
    assert [limiter.check(key) for _ in range(3)] == [None, None, None]
    assert limiter.check(key) == pytest.approx(45.0)   # until the window ends at T0 + 60
    assert limiter.check(key) == pytest.approx(45.0)   # refused requests are not counted
    assert limiter.check(_key(key_id=2, rpm=3)) is None  # per key
    clock.now = T0 + 60
    assert limiter.check(key) is None


def test_sliding_window_weighs_the_last_window(make_limiter):
    clock = FakeClock(T0 + 30)
    limiter = make_limiter("sliding", clock)
    key = _key(rpm=10)
    assert all(limiter.check(key) is None for _ in range(10))
    assert limiter.check(key) == pytest.approx(30 + 60 * (1 - 9 / 10))  # next window, once 10 decays to 9
    clock.now = T0 + 60 + 30  # half-way through the next window: estimate = 10 * 0.5 + current
    assert all(limiter.check(key) is None for _ in range(4))
    assert limiter.check(key) is None   # 5 + 5 = 10 <= 10
    # estimate 10 * 0.5 + 5 + 1 > 10: wait until 10 * (1 - t / 60) + 6 <= 10, t = 36 s into the window
    assert limiter.check(key) == pytest.approx(6.0)
    clock.now = T0 + 60 + 36
    assert limiter.check(key) is None


def test_tokens_per_minute(make_limiter):
    clock = FakeClock(T0)
    limiter = make_limiter("fixed", clock)
    key = _key(tpm=100)
    assert limiter.check(key) is None
    limiter.record_tokens(key, 60)
    assert limiter.check(key) is None
    limiter.record_tokens(key, 40)
    assert limiter.check(key) == pytest.approx(60.0)   # 100 tokens used: no room left this window
    assert limiter.check(_key(key_id=3, tpm=100), tokens=101) == pytest.approx(60.0)  # estimate too large
    clock.now = T0 + 60
    assert limiter.check(key, tokens=80) is None        # an estimate counts at once
    assert limiter.check(key, tokens=30) is not None


def test_a_refusal_names_the_limit_that_refused(make_limiter):
    limiter = make_limiter("fixed", FakeClock(T0 + 15))
    by_tokens, by_requests = _key(key_id=4, rpm=100, tpm=10), _key(key_id=5, rpm=1, tpm=1000)
    assert limiter.admit(by_tokens) is None and limiter.admit(by_requests) is None
    limiter.record_tokens(by_tokens, 10)
    assert limiter.admit(by_tokens) == RateLimited("tokens", pytest.approx(45.0))  # the 429's type: "tokens"
    assert limiter.admit(by_requests) == RateLimited("requests", pytest.approx(45.0))


def test_unlimited_and_master_keys_are_never_limited(make_limiter):
    limiter = make_limiter()
    assert all(limiter.check(_key()) is None for _ in range(50))
    assert all(limiter.check(MASTER_IDENTITY) is None for _ in range(50))


def test_concurrent_checks_admit_exactly_the_limit(make_limiter):
    limiter = make_limiter("fixed", FakeClock(T0 + 1))
    key = _key(key_id=7, rpm=20)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: limiter.check(key), range(60)))
    assert sum(r is None for r in results) == 20
    assert all(r == pytest.approx(59.0) for r in results if r is not None)


def test_redis_counters_are_shared_between_limiters(engine, redis_url, unique_prefix):
    """Two limiters (two gateway replicas) on one Redis share the counts."""
    clock = FakeClock(T0)
    one = RateLimiter(redis_url=redis_url, window="fixed", prefix=unique_prefix, clock=clock)
    two = RateLimiter(redis_url=redis_url, window="fixed", prefix=unique_prefix, clock=clock)
    key = _key(rpm=4)
    assert [one.check(key), two.check(key), one.check(key), two.check(key)] == [None] * 4
    assert one.check(key) is not None and two.check(key) is not None
    one.close(), two.close()


def test_rate_limiter_needs_a_store():
    with pytest.raises(ValueError):
        RateLimiter()
    with pytest.raises(ValueError):
        RateLimiter(redis_url="redis://127.0.0.1:6379/0", window="leaky")


# --- budgets ------------------------------------------------------------------------------------


def test_reserve_settle_release(session, engine):
    key, _ = create_key(session, "budget", budget_usd=1.0)
    ledger = BudgetLedger(engine)
    held = ledger.reserve(key.id, 0.4)
    assert get_key(session, key.id).reserved_usd == pytest.approx(0.4)
    ledger.settle(held, 0.25)
    state = get_key(session, key.id)
    assert state.spend_usd == pytest.approx(0.25) and state.reserved_usd == 0
    failed = ledger.reserve(key.id, 0.7)
    ledger.release(failed)
    state = get_key(session, key.id)
    assert state.spend_usd == pytest.approx(0.25) and state.reserved_usd == 0
    with pytest.raises(ValueError):
        ledger.settle(failed, 0.1)   # closed already
    ledger.reserve(key.id, 0.75)     # exactly fills the budget


def test_reserve_refuses_with_the_numbers(session, engine):
    key, _ = create_key(session, "tight", budget_usd=0.10)
    ledger = BudgetLedger(engine)
    ledger.settle(ledger.reserve(key.id, 0.06), 0.06)
    ledger.reserve(key.id, 0.03)  # in flight
    with pytest.raises(BudgetExceeded) as refused:
        ledger.reserve(key.id, 0.02)
    message = str(refused.value)
    assert "$0.100000" in message and "$0.060000" in message and "$0.030000" in message and "$0.020000" in message
    assert refused.value.budget_usd == pytest.approx(0.1) and refused.value.max_cost_usd == 0.02
    assert get_key(session, key.id).reserved_usd == pytest.approx(0.03)  # the refusal held nothing


def test_keys_without_budget_track_spend(session, engine):
    key, _ = create_key(session, "unbudgeted")
    ledger = BudgetLedger(engine)
    for _ in range(3):
        ledger.settle(ledger.reserve(key.id, 1000.0), 2.5)
    assert get_key(session, key.id).spend_usd == pytest.approx(7.5)
    with pytest.raises(KeyNotFound):
        ledger.reserve(10**9, 0.1)
    with pytest.raises(ValueError):
        ledger.reserve(key.id, -1.0)


def test_overspend_is_bounded_by_one_request(session, engine):
    """A request whose real cost exceeds its reserved maximum may push spend past the budget, by at most
    its own cost; the next request is refused."""
    key, _ = create_key(session, "overspend", budget_usd=1.0)
    ledger = BudgetLedger(engine)
    ledger.settle(ledger.reserve(key.id, 0.9), 1.2)
    with pytest.raises(BudgetExceeded):
        ledger.reserve(key.id, 0.0001)
    assert get_key(session, key.id).spend_usd == pytest.approx(1.2)


def test_max_cost():
    assert max_cost_usd(1000, 500, 0.15, 0.60) == pytest.approx((1000 * 0.15 + 500 * 0.60) / 1e6)


BUDGET_USD, COST_USD = 1.0, 0.03
EXPECTED_ADMITTED = usd_to_nano(BUDGET_USD) // usd_to_nano(COST_USD)  # floor(1.00 / 0.03) = 33


def _spend_in_threads(ledger: BudgetLedger, key_id: int, num_requests: int) -> int:
    def one(_):
        try:
            reservation = ledger.reserve(key_id, COST_USD)
        except BudgetExceeded:
            return 0
        ledger.settle(reservation, COST_USD)
        return 1

    with ThreadPoolExecutor(num_requests) as pool:
        return sum(pool.map(one, range(num_requests)))


def test_parallel_reservations_never_pass_the_budget(session, engine):
    assert EXPECTED_ADMITTED == 33
    key, _ = create_key(session, "parallel", budget_usd=BUDGET_USD)
    admitted = _spend_in_threads(BudgetLedger(engine), key.id, 60)
    state = get_key(session, key.id)
    assert admitted == EXPECTED_ADMITTED
    assert state.spend_usd <= BUDGET_USD and state.spend_usd == pytest.approx(EXPECTED_ADMITTED * COST_USD)
    assert state.reserved_usd == 0


WORKER = """
import sys
from link.db import make_db_engine
from link.limits import BudgetLedger
sys.path.insert(0, sys.argv[4])
from test_limits import _spend_in_threads
engine = make_db_engine(sys.argv[1])
print(_spend_in_threads(BudgetLedger(engine), int(sys.argv[2]), int(sys.argv[3])))
"""


def test_two_processes_share_the_budget(session, engine, db_url):
    """Two OS processes (like two gateway replicas), 30 threads each, against one key in one database."""
    key, _ = create_key(session, "two-processes", budget_usd=BUDGET_USD)
    processes = [subprocess.Popen([sys.executable, "-c", WORKER, db_url, str(key.id), "30", str(Path(__file__).parent)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=180) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
    admitted = [int(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    state = get_key(session, key.id)
    assert sum(admitted) == EXPECTED_ADMITTED
    assert state.spend_usd <= BUDGET_USD and state.reserved_usd == 0
