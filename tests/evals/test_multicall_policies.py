"""Multi-call policies (MoA, cascade, hybrid) in the evals: the --max-cost reservation covers every call, and
offline replay charges the one recorded answer that is the plan's answer, or refuses clearly.

    .venv/bin/python -m pytest -q tests/evals/test_multicall_policies.py
"""

from __future__ import annotations

import asyncio

import pytest

from evals.cost_guard import CostGuard, GuardedTarget, cost_bound_usd
from evals.outcomes import Outcome, OutcomeTable
from evals.replay import ReplayError, build_policy, replay
from evals.target_gateway import in_process_gateway
from evals.target_factory import resolve_targets
from evals.targets import CallBound, Completion, Prices
from link.config import parse_config
from link.policies.base import make_policy
from routers.base import ROUTERS
from tests.link.gateway_launch import gateway_settings, mock_deployment
from tests.link.router_fakes import TableRouter, save_table_router

HI = [{"role": "user", "content": "hi there"}]


def test_cost_bound_multiplies_the_calls_and_grows_each_prompt_by_hand():
    # "0123456789": 5 prompt tokens; one call: 5 x 2 + 100 x 4 = 410 micro-USD
    assert cost_bound_usd(Prices(2.0, 4.0), "0123456789", {"max_tokens": 100}) == pytest.approx(410e-6)
    # 3 calls, each reading 5 + 2 x 100 + 256 = 461 tokens and writing 100: 3 x (922 + 400)
    calls = CallBound(calls=3, prompt_tokens_per_max_token=2, extra_prompt_tokens=256)
    assert cost_bound_usd(Prices(2.0, 4.0), "0123456789", {"max_tokens": 100}, calls) == pytest.approx(3 * 1322e-6)
    assert CallBound.from_card({"calls": 3, "models": ["a"], "prompt_tokens_per_max_token": 2,
                                "extra_prompt_tokens": 256}) == calls
    for bad in ({"models": ["a"]}, {"calls": 0}, {"calls": 2, "extra_prompt_tokens": -1}):
        with pytest.raises(ValueError, match="malformed cost_bound"):
            CallBound.from_card(bad)


class Recording:
    """A target whose calls note the guard's reservation in flight."""

    def __init__(self, guard: CostGuard, call_bound: CallBound | None):
        self.name, self.prices, self.call_bound, self.guard, self.seen = "policy", Prices(0.0, 1000.0), call_bound, guard, []

    async def chat(self, messages, **params):
        self.seen.append(self.guard.reserved_usd)
        return Completion("ok", cost_usd=0.0)

    async def complete(self, prompt, **params):
        raise NotImplementedError


def test_guarded_target_reserves_every_call_of_a_multi_call_policy():
    async def reserved(call_bound):
        guard = CostGuard(max_cost_usd=1.0)
        target = Recording(guard, call_bound)
        await GuardedTarget(target, guard).chat(HI, max_tokens=100)
        return target.seen[0]

    assert asyncio.run(reserved(None)) == pytest.approx(0.1)                    # 100 tokens at $1000/M
    assert asyncio.run(reserved(CallBound(calls=3))) == pytest.approx(0.3)      # three such calls


def test_moa_cascade_and_hybrid_cards_price_every_call(mock, tmp_path, new_database_url):
    path = save_table_router(tmp_path / "r.safetensors", ["small", "big", "moa-col"])
    base = mock.api_base
    config = parse_config({
        "models": [mock_deployment("small", base), mock_deployment("big", base, output_cost_per_million=3000.0),
                   mock_deployment("agg", base, input_cost_per_million=5000.0)],
        "policies": [
            {"name": "link/moa", "type": "moa", "models": ["small", "big"], "options": {"aggregator": "agg", "layers": 2}},
            {"name": "judged", "type": "cascade", "models": ["small", "big"], "options": {"judge": "agg"}},
            {"name": "scored", "type": "cascade", "models": ["small", "big"], "options": {"scorer": "router", "path": str(path)}},
            {"name": "hybrid", "type": "hybrid", "models": ["small", "big"],
             "options": {"path": str(path), "moa_column": "moa-col", "moa": {"models": ["small", "big"], "aggregator": "agg"}}},
            {"name": "fb", "type": "fallback", "models": ["small", "big"]}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path)

    async def go():
        async with in_process_gateway(settings, config) as gateway:
            names = ["link/moa", "judged", "scored", "hybrid", "fb"]
            return gateway, dict(zip(names, resolve_targets(names, gateway.cards, gateway.client, prices=gateway.prices)))

    try:
        gateway, targets = asyncio.run(go())
        bound = gateway.cards["link/moa"]["link"]["cost_bound"]
        # 2 layers x 2 proposers + the aggregator; each prompt holds one layer's 2 answers + the instruction
        assert bound == {"calls": 5, "models": ["agg", "small", "big"], "prompt_tokens_per_max_token": 2,
                         "extra_prompt_tokens": 256}
        moa = targets["link/moa"]
        assert moa.prices == Prices(5000.0, 3000.0)      # the aggregator's input price counts though not in `models`
        assert moa.call_bound == CallBound(5, 2, 256)
        assert targets["judged"].call_bound == CallBound(3, 1, 256) and targets["judged"].prices == Prices(5000.0, 3000.0)
        assert targets["scored"].call_bound == CallBound(2, 0, 0) and targets["scored"].prices == Prices(1000.0, 3000.0)
        assert targets["hybrid"].call_bound == CallBound(3, 2, 256)
        assert targets["fb"].call_bound is None and "cost_bound" not in gateway.cards["fb"]["link"]
        # the eval's reservation covers the gateway's own for the same request
        body = {"messages": HI, "max_tokens": 64}
        for name in ("link/moa", "judged", "hybrid"):
            policy = make_policy(next(p for p in config.policies if p.name == name), [m.name for m in config.models])
            gateway_bound = policy.executor.max_cost_usd("chat", body, config.deployments)
            assert cost_bound_usd(targets[name].prices, HI, {"max_tokens": 64}, targets[name].call_bound) >= gateway_bound > 0
    finally:
        ROUTERS.pop(TableRouter.type, None)


# --- offline replay -------------------------------------------------------------------------------------------

def _table(extra: list[Outcome] = ()) -> OutcomeTable:
    """Two prompts ("a math question" predicted hard for small, "hello" easy) answered by small and big."""
    rows = [Outcome("p1", "toy", "a math question", "small", 0.0, 0.001), Outcome("p1", "toy", "a math question", "big", 1.0, 0.01),
            Outcome("p2", "toy", "hello", "small", 1.0, 0.001), Outcome("p2", "toy", "hello", "big", 1.0, 0.01)]
    return OutcomeTable([*rows, *extra])


@pytest.fixture()
def router_file(tmp_path):
    yield save_table_router(tmp_path / "r.safetensors", ["small", "big", "moa-col"])
    ROUTERS.pop(TableRouter.type, None)


def test_a_router_scored_cascade_is_charged_its_answering_step_only(router_file):
    table = _table()
    # predicted quality of small: 0.6 on "hello", 0.2 on math (tests/link/router_fakes.py): a 0.5 threshold
    # escalates the math prompt to big and keeps "hello" on small; the skipped step costs nothing
    policy = build_policy("cheap-first", table.models, policy_type="cascade", models=["small", "big"],
                          options={"scorer": "router", "path": str(router_file), "threshold": 0.5})
    result = replay(policy, table)
    assert result.picks == {"p1": "big", "p2": "small"}
    assert result.total_cost_usd == pytest.approx(0.01 + 0.001) and result.mean_score == 1.0
    stricter = build_policy("strict", table.models, policy_type="cascade", models=["small", "big"],
                            options={"scorer": "router", "path": str(router_file), "threshold": 0.7})
    assert replay(stricter, table).picks == {"p1": "big", "p2": "big"}


def test_judge_cascades_and_unrecorded_moas_are_refused_with_the_way_out():
    table = _table()
    judged = build_policy("judged", table.models, policy_type="cascade", models=["small", "big"], options={"judge": "big"})
    with pytest.raises(ReplayError, match="link router eval.*link eval run --target judged"):
        replay(judged, table)
    moa = build_policy("link/moa", table.models, policy_type="moa", models=["small", "big"])
    with pytest.raises(ReplayError, match="recorded as 'link/moa', which the table lacks"):
        replay(moa, table)


def test_a_moa_recorded_by_eval_run_replays_its_own_rows_and_a_hybrid_its_moa_column(router_file):
    moa_rows = [Outcome("p1", "toy", "a math question", "link/moa", 1.0, 0.05),
                Outcome("p2", "toy", "hello", "link/moa", 0.0, 0.04)]
    table = _table(moa_rows)
    moa = build_policy("link/moa", table.models, policy_type="moa", models=["small", "big"])
    result = replay(moa, table)
    assert result.picks == {"p1": "link/moa", "p2": "link/moa"} and result.total_cost_usd == pytest.approx(0.09)
    # the hybrid predicts the MoA from the router's "moa-col" column: relabel the recorded MoA rows as it
    table = _table([Outcome(o.prompt_id, o.suite, o.prompt, "moa-col", o.score, o.cost_usd) for o in moa_rows])
    # lambda 0: the math prompt goes to the MoA (0.99 > big's 0.9), "hello" too (0.75 > 0.7 > 0.6)
    hybrid = build_policy("hybrid", table.models, policy_type="hybrid", models=["small", "big"],
                          options={"path": str(router_file), "cost_penalty": 0, "moa_column": "moa-col",
                                   "moa": {"aggregator": "big"}})
    assert replay(hybrid, table).picks == {"p1": "moa-col", "p2": "moa-col"}
    # lambda 20 (costs: small .001, big .01, MoA .02): math to big (.9 - .2 > .99 - .4 > .2 - .02), "hello" to
    # small (.6 - .02 > .7 - .2 > .75 - .4): single models, charged as usual
    thrifty = build_policy("hybrid", table.models, policy_type="hybrid", models=["small", "big"],
                           options={"path": str(router_file), "cost_penalty": 20, "moa_column": "moa-col",
                                    "moa": {"aggregator": "big"}})
    assert replay(thrifty, table).picks == {"p1": "big", "p2": "small"}
