"""evals.runner and evals.cost_guard with a fake suite and fake targets (no model, no network).

    .venv/bin/python -m pytest -q tests/evals/test_runner.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest

from evals.cache import EvalStore
from evals.cost_guard import CostGuard, GuardedTarget, cost_bound_usd
from evals.outcomes import OutcomeTable
from evals.runner import run_eval
from evals.targets import Prices, TargetError
from tests.evals.fakes import FakeSuite, FakeTarget, correct_when


def run(coro):
    return asyncio.run(coro)


def test_scores_outcomes_and_files(tmp_path, sqlite_url):
    suite = FakeSuite(n=10)
    items = suite.load("test")
    good = FakeTarget("good", correct_when(lambda i: True), cost_usd=0.002)
    half = FakeTarget("half", correct_when(lambda i: i % 2 == 0))
    store = EvalStore(sqlite_url)
    result = run(run_eval(suite, items, [good, half], store=store, progress=False, out_dir=tmp_path / "run", run_id="r1"))
    assert result.stopped_reason == "completed"
    assert result.totals["good"]["score"] == 1.0 and result.totals["half"]["score"] == 0.5
    assert result.totals["good"]["cost_usd"] == pytest.approx(0.02) and result.totals["half"]["cost_usd"] == 0.0
    assert result.totals["good"]["errors"] == 0 and result.totals["good"]["n"] == 10
    # Token counts from the fake: "question i" is 2 prompt tokens, the reply 1 completion token.
    assert result.totals["half"]["prompt_tokens"] == 20 and result.totals["half"]["completion_tokens"] == 10
    table = OutcomeTable.read(tmp_path / "run" / "outcomes.jsonl")
    assert table.models == ("good", "half") and table.prompt_ids == tuple(i.id for i in items)
    assert [r.score for r in table.select(models=["half"])] == [1.0, 0.0] * 5
    grades = [json.loads(line) for line in (tmp_path / "run" / "grades.jsonl").read_text().splitlines()]
    assert len(grades) == 20 and all(g["error"] is None for g in grades)
    assert all(g["served_models"] == [g["model"]] for g in grades)  # the fake answers under its own name
    record = store.get_run("r1")
    assert record["status"] == "finished" and record["targets"] == ["good", "half"]
    assert record["totals"]["half"]["score"] == 0.5
    assert len(store.load_run_outcomes("r1")) == 20


class ToolSuite(FakeSuite):
    """FakeSuite whose odd items offer a tool, as BFCL's chat requests do."""

    def request(self, item):
        style, request = super().request(item)
        if int(item.id.rsplit("/", 1)[1]) % 2:
            request["params"] = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
        return style, request


def test_outcome_rows_record_whether_the_request_offered_tools(tmp_path):
    suite = ToolSuite(n=4)
    run(run_eval(suite, suite.load(), [FakeTarget("m", "x")], progress=False, out_dir=tmp_path))
    rows = OutcomeTable.read(tmp_path / "outcomes.jsonl").rows
    assert [(r.prompt_id, r.has_tools) for r in rows] == [(f"fake/test/{i}", i % 2 == 1) for i in range(4)]


def test_concurrency_limit_is_respected(tmp_path):
    suite = FakeSuite(n=12)
    target = FakeTarget("slow", "x", delay_s=0.02)
    run(run_eval(suite, suite.load(), [target], concurrency=3, progress=False, out_dir=tmp_path))
    assert target.max_in_flight == 3 and len(target.completed) == 12


@pytest.mark.parametrize("order", ["interleave", "by-target"])
def test_pair_order(tmp_path, order):
    # concurrency 1: the calls happen in queue order, one at a time
    suite = FakeSuite(n=3)
    shared: list[tuple[str, str]] = []

    class Logged(FakeTarget):
        async def _call(self, kind, request, params):
            shared.append((self.name, request[-1]["content"] if isinstance(request, list) else request))
            return await super()._call(kind, request, params)

    targets = [Logged("a"), Logged("b")]
    run(run_eval(suite, suite.load(), targets, concurrency=1, progress=False, out_dir=tmp_path, order=order))
    names = [name for name, _ in shared]
    assert names == (["a", "b"] * 3 if order == "interleave" else ["a"] * 3 + ["b"] * 3)
    with pytest.raises(ValueError, match="order"):
        run(run_eval(suite, suite.load(), targets, progress=False, out_dir=tmp_path, order="random"))


def test_retries_then_success(tmp_path):
    suite = FakeSuite(n=4)
    flaky = FakeTarget("flaky", correct_when(lambda i: True),
                       fail=lambda text, attempt: TargetError("503", retryable=True, status=503) if attempt < 2 else None)
    result = run(run_eval(suite, suite.load(), [flaky], retries=3, backoff_s=0.001, progress=False, out_dir=tmp_path))
    assert result.totals["flaky"]["score"] == 1.0 and result.totals["flaky"]["errors"] == 0
    assert all(n == 3 for n in flaky.attempts.values())  # two failures, then success


def test_permanent_failures_are_recorded_not_raised(tmp_path):
    suite = FakeSuite(n=6)

    def fail(text, attempt):
        if text.endswith(" 1"):
            return TargetError("HTTP 400: bad request", retryable=False, status=400)
        if text.endswith(" 2"):
            return TargetError("HTTP 500", retryable=True, status=500)
        return None

    target = FakeTarget("m", correct_when(lambda i: True), fail=fail)
    result = run(run_eval(suite, suite.load(), [target], retries=2, backoff_s=0.001, progress=False, out_dir=tmp_path))
    assert result.totals["m"]["errors"] == 2 and result.totals["m"]["n"] == 6
    assert result.totals["m"]["score"] == pytest.approx(4 / 6)
    assert target.attempts["question 1"] == 1 and target.attempts["question 2"] == 3  # no retry of a 400; 1 + 2 retries
    assert "HTTP 400" in result.grades["m"]["fake/test/1"].details["error"]
    rows = {r.prompt_id: r for r in result.outcomes}
    assert rows["fake/test/2"].score == 0.0 and rows["fake/test/2"].latency_s is None


def test_backoff_is_exponential_with_jitter():
    delays = []

    async def fake_sleep(seconds):
        delays.append(seconds)

    target = FakeTarget("m", "ok", fail=lambda text, attempt: TargetError("429", retryable=True, status=429))
    guarded = GuardedTarget(target, CostGuard(), retries=4, backoff_s=1.0, rng=random.Random(0))
    guarded.sleep = fake_sleep
    with pytest.raises(TargetError):
        run(guarded.chat([{"role": "user", "content": "hi"}]))
    assert len(delays) == 4 and target.attempts["hi"] == 5
    for k, delay in enumerate(delays):  # base * 2**k scaled by a factor in [0.5, 1.5)
        assert 0.5 * 2**k <= delay < 1.5 * 2**k
    assert len(set(round(d / 2**k, 6) for k, d in enumerate(delays))) > 1  # the factors differ: jitter


def _interrupted_then_resumed(tmp_path, url, cancel_after: int):
    suite = FakeSuite(n=16)
    items = suite.load()
    first = FakeTarget("m", correct_when(lambda i: i % 3 != 0), cost_usd=0.001, delay_s=0.01)

    async def interrupt():
        task = asyncio.create_task(run_eval(suite, items, [first], concurrency=2, store=EvalStore(url),
                                            progress=False, out_dir=tmp_path / "a"))
        while len(first.completed) < cancel_after:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(interrupt())
    finished = set(first.completed)
    second = FakeTarget("m", correct_when(lambda i: i % 3 != 0), cost_usd=0.001, delay_s=0.01)
    resumed = run(run_eval(suite, items, [second], concurrency=2, store=EvalStore(url), progress=False, out_dir=tmp_path / "b"))
    return finished, second, resumed


def test_interrupted_run_resumes_from_the_cache(tmp_path, sqlite_url):
    finished, second, resumed = _interrupted_then_resumed(tmp_path, sqlite_url, cancel_after=7)
    assert 7 <= len(finished) < 16
    assert not finished & set(second.completed)  # no new call for an item finished before the interruption
    assert len(finished) + len(second.completed) == 16
    assert resumed.calls["m"] == {"cache_hits": len(finished), "calls": 16 - len(finished)}
    fresh = FakeTarget("m", correct_when(lambda i: i % 3 != 0), cost_usd=0.001, delay_s=0.01)
    suite = FakeSuite(n=16)
    uninterrupted = run(run_eval(suite, suite.load(), [fresh], concurrency=2, store=None, progress=False,
                                 out_dir=tmp_path / "c"))
    assert resumed.totals == uninterrupted.totals
    assert [r.score for r in resumed.outcomes] == [r.score for r in uninterrupted.outcomes]
    # A third run makes no call at all.
    third = FakeTarget("m", "never called")
    again = run(run_eval(suite, suite.load(), [third], store=EvalStore(sqlite_url), progress=False, out_dir=tmp_path / "d"))
    assert third.requests == [] and again.totals == uninterrupted.totals


def test_interrupted_run_is_recorded(tmp_path, sqlite_url):
    _interrupted_then_resumed(tmp_path, sqlite_url, cancel_after=3)
    statuses = sorted(r["status"] for r in EvalStore(sqlite_url).list_runs())
    assert statuses == ["finished", "interrupted"]


def test_cost_bound_formula():
    # 10 characters -> 5 prompt tokens at $2/M, max_tokens 100 at $4/M.
    assert cost_bound_usd(Prices(2.0, 4.0), "0123456789", {"max_tokens": 100}) == pytest.approx((5 * 2 + 100 * 4) / 1e6)
    assert cost_bound_usd(Prices(2.0, 4.0), "012345678", {"max_tokens": 1, "n": 3}) == pytest.approx((5 * 2 + 3 * 4) / 1e6)


def test_max_cost_with_known_prices_stops_before_the_cap(tmp_path, sqlite_url):
    # Bound per call: 0 input price + 10 max_tokens x $1000/M = $0.01; each call really costs $0.006.
    # Sequentially, call k+1 starts only if 0.006 k + 0.01 <= 0.05, i.e. k <= 6: seven calls, $0.042.
    suite = FakeSuite(n=20)
    target = FakeTarget("paid", "x", cost_usd=0.006, prices=Prices(0.0, 1000.0))
    store = EvalStore(sqlite_url)
    result = run(run_eval(suite, suite.load(), [target], max_cost_usd=0.05, concurrency=1, store=store,
                          progress=False, out_dir=tmp_path, run_id="capped"))
    assert result.stopped_reason == "max_cost"
    assert len(target.requests) == 7 and len(result.outcomes) == 7
    assert result.spent_usd == pytest.approx(0.042) and result.spent_usd <= 0.05
    assert store.get_run("capped")["status"] == "stopped"


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_max_cost_is_never_exceeded_concurrently(tmp_path, concurrency):
    suite = FakeSuite(n=40)
    rng = random.Random(concurrency)
    costs = iter([rng.uniform(0.001, 0.01) for _ in range(200)])

    class Varying(FakeTarget):
        async def _call(self, kind, request, params):
            completion = await super()._call(kind, request, params)
            return dataclasses.replace(completion, cost_usd=next(costs))

    target = Varying("paid", "x", delay_s=0.003, prices=Prices(0.0, 1000.0))  # bound $0.01 >= any real cost
    result = run(run_eval(suite, suite.load(), [target], max_cost_usd=0.1, concurrency=concurrency, progress=False,
                          out_dir=tmp_path))
    assert result.stopped_reason == "max_cost" and result.spent_usd <= 0.1
    assert sum(r.cost_usd for r in result.outcomes) == pytest.approx(result.spent_usd)


def test_max_cost_with_unknown_prices_uses_the_costs_seen(tmp_path):
    # No prices: the first call runs alone (bound 0), then each call is bounded by the largest seen ($0.01):
    # after it, 0.01 + 0.01 + 0.01 <= 0.035 admits two more in flight; a fourth would reach 0.04.
    suite = FakeSuite(n=20)
    target = FakeTarget("unpriced", "x", cost_usd=0.01, delay_s=0.01)
    result = run(run_eval(suite, suite.load(), [target], max_cost_usd=0.035, concurrency=4, progress=False,
                          out_dir=tmp_path))
    assert result.stopped_reason == "max_cost" and len(target.requests) == 3
    assert result.spent_usd == pytest.approx(0.03)


def test_cache_hits_cost_nothing_against_the_cap(tmp_path, sqlite_url):
    suite = FakeSuite(n=5)
    paid = FakeTarget("paid", "x", cost_usd=0.006, prices=Prices(0.0, 1000.0))
    run(run_eval(suite, suite.load(), [paid], store=EvalStore(sqlite_url), progress=False, out_dir=tmp_path / "a"))
    again = FakeTarget("paid", "x", cost_usd=0.006, prices=Prices(0.0, 1000.0))
    result = run(run_eval(suite, suite.load(), [again], max_cost_usd=0.0, store=EvalStore(sqlite_url), progress=False,
                          out_dir=tmp_path / "b"))
    assert result.stopped_reason == "completed" and again.requests == [] and result.spent_usd == 0.0
    assert result.totals["paid"]["cost_usd"] == pytest.approx(0.03)  # the recorded cost of the answers


def test_arguments_are_checked(tmp_path):
    suite = FakeSuite(n=1)
    with pytest.raises(ValueError, match="distinct"):
        run(run_eval(suite, suite.load(), [FakeTarget("a"), FakeTarget("a")], progress=False, out_dir=tmp_path))
    with pytest.raises(ValueError, match="concurrency"):
        run(run_eval(suite, suite.load(), [FakeTarget("a")], concurrency=0, progress=False, out_dir=tmp_path))


def test_progress_bar_renders(tmp_path):
    suite = FakeSuite(n=3)
    result = run(run_eval(suite, suite.load(), [FakeTarget("a", correct_when(lambda i: True))], progress=True,
                          out_dir=tmp_path))
    assert result.totals["a"]["score"] == 1.0
