"""One routing objective: `routers.decision.rank`, the router and hybrid policies and offline evaluation's
sweep, fed the same predicted qualities, expected costs and knob, give the same order; the cascade policy keeps
the same candidates (rank's, under its cost ceiling) in its escalation order, cheapest first.

The qualities and costs are the test router's PLAIN row and COSTS (tests/link/router_fakes.py):

    model     quality  cost (USD)
    small     0.6      0.001
    big       0.7      0.01
    down      0.1      0.0005
    moa-col   0.75     0.02     (the hybrid policy's MoA option, "moa", reads this column)
"""

from __future__ import annotations

import numpy as np
import pytest

import asyncio

from link.config import PolicyConfig
from link.policies.base import PolicyRequest
from link.policies.cascade import CascadePolicy
from link.policies.hybrid import MOA, HybridPolicy
from link.policies.router import RouterPolicy
from routers.base import ROUTERS
from routers.decision import rank
from routers.offline.calibration import sweep
from routers.request import RoutingRequest
from tests.link.router_fakes import COSTS, PLAIN, TableRouter, save_table_router

MODELS = ["small", "big", "down", "moa-col"]
STEPS = ["down", "small", "big", "moa-col"]   # a cascade's escalation order: by cost, cheapest first
BODY = {"messages": [{"role": "user", "content": "a plain question"}]}

# (lambda, max cost USD, the order, every candidate over the ceiling), worked out by hand from the table:
CASES = [
    # lambda 0: by quality
    (0.0, None, ["moa-col", "big", "small", "down"], False),
    # 0.6 - 0.02 = 0.58, 0.7 - 0.2 = 0.5, 0.75 - 0.4 = 0.35, 0.1 - 0.01 = 0.09
    (20.0, None, ["small", "big", "moa-col", "down"], False),
    # 0.7 - 0.05 = 0.65 = 0.75 - 0.1: a tie, the cheaper (big) first; then small 0.595, down 0.0975
    (5.0, None, ["big", "moa-col", "small", "down"], False),
    # 0.5, 0.05, -0.3, -1.25
    (100.0, None, ["small", "down", "big", "moa-col"], False),
    # big and moa-col cost over 0.005 USD: left out
    (0.0, 0.005, ["small", "down"], False),
    # every candidate over 0.0001 USD: the cheapest (down) answers alone, flagged
    (0.0, 0.0001, ["down"], True),
]


@pytest.fixture(scope="module")
def router_file(tmp_path_factory):
    yield save_table_router(tmp_path_factory.mktemp("rank") / "four.safetensors", MODELS)
    ROUTERS.pop(TableRouter.type, None)


@pytest.fixture(scope="module")
def router_policy(router_file):
    config = PolicyConfig(name="auto", type="router", models=MODELS, options={"path": str(router_file)})
    return RouterPolicy(config, MODELS)


@pytest.fixture(scope="module")
def hybrid_policy(router_file):
    config = PolicyConfig(name="hybrid", type="hybrid", models=["small", "big", "down"],
                          options={"path": str(router_file), "moa": {"models": ["small", "big"], "aggregator": "big"},
                                   "moa_column": "moa-col"})
    return HybridPolicy(config, MODELS)


def cascade_plan(router_file, max_cost: float | None):
    """The plan of a router-scored cascade over STEPS with `max_cost_usd` (None: no ceiling)."""
    options = {"scorer": "router", "path": str(router_file), "threshold": 0.5}
    if max_cost is not None:
        options["max_cost_usd"] = max_cost
    policy = CascadePolicy(PolicyConfig(name="cascade", type="cascade", models=STEPS, options=options), MODELS)
    return asyncio.run(policy.plan(PolicyRequest("chat", BODY, tuple(MODELS))))


def offline_order(cost_penalty: float) -> list[str]:
    """The order offline evaluation's lambda sweep gives: each place is the sweep's pick at this lambda among
    the models not yet placed (a placed model's quality is unknown, NaN, to the next sweep)."""
    quality = np.array([[PLAIN[m] for m in MODELS]])
    cost = np.array([[COSTS[m] for m in MODELS]])
    order = []
    for _ in MODELS:
        share = sweep(quality, cost, knobs=np.array([cost_penalty])).share[0]
        pick = int(np.argmax(share))
        order.append(MODELS[pick])
        quality[0, pick] = np.nan
    return order


@pytest.mark.parametrize("cost_penalty, max_cost, expected, over", CASES)
def test_the_policies_offline_evaluation_and_rank_give_one_order(router_file, router_policy, hybrid_policy, cost_penalty,
                                                                max_cost, expected, over):
    ranking = rank({m: PLAIN[m] for m in MODELS}, {m: COSTS[m] for m in MODELS}, cost_penalty, max_cost)
    assert list(ranking.order) == expected
    assert ranking.is_over_max_cost is over
    assert ranking.excluded == [m for m in MODELS if m not in expected]

    request = RoutingRequest.from_body(BODY, cost_penalty=cost_penalty, max_cost_usd=max_cost)
    routed = router_policy.decide(request)
    assert routed["order"] == expected
    assert routed["objective"] == pytest.approx({m: PLAIN[m] - cost_penalty * COSTS[m] for m in MODELS})

    hybrid = hybrid_policy.decide(request)
    assert [("moa-col" if o == MOA else o) for o in hybrid["order"]] == expected
    if max_cost is not None:
        assert routed["over_max_cost"] is over and hybrid["over_max_cost"] is over
    else:
        assert offline_order(cost_penalty) == expected   # offline evaluation sweeps without a ceiling

    # the cascade has no lambda (its knob is a score threshold, and its steps go cheapest first whatever their
    # objective): it keeps rank's candidates, in its own order, each step with its threshold
    plan = cascade_plan(router_file, max_cost)
    assert plan.models == [m for m in STEPS if m in expected]
    if max_cost is not None:
        assert plan.decision["over_max_cost"] is over and plan.decision["excluded"] == ranking.excluded
        assert plan.decision["expected_cost_usd"] == pytest.approx({m: COSTS[m] for m in STEPS})
    assert (plan.executor is None) == (len(expected) == 1)
    if plan.executor is not None:
        assert plan.executor.cascade.models == plan.models and plan.decision["thresholds"] == [0.5] * (len(expected) - 1)


def test_a_cascade_under_a_ceiling_keeps_each_steps_threshold(router_file):
    # small (0.001 USD) and down (0.0005) fit 0.005 USD; big and moa-col do not: small becomes the last step
    options = {"scorer": "router", "path": str(router_file), "threshold": [0.9, 0.4, 0.3], "max_cost_usd": 0.005}
    policy = CascadePolicy(PolicyConfig(name="c", type="cascade", models=STEPS, options=options), MODELS)
    plan = asyncio.run(policy.plan(PolicyRequest("chat", BODY, tuple(MODELS))))
    assert plan.models == ["down", "small"] and plan.executor.cascade.thresholds == [0.9]
    assert plan.decision["thresholds"] == [0.9] and plan.decision["excluded"] == ["big", "moa-col"]
    assert policy.cascade.models == STEPS and policy.cascade.thresholds == [0.9, 0.4, 0.3]   # the policy's own


@pytest.mark.parametrize("options, models, param", [
    ({"scorer": "judge", "max_cost_usd": 0.01}, ["small", "big"], "options.max_cost_usd"),   # only a router prices steps
    ({"max_cost_usd": -1.0}, STEPS, "options.max_cost_usd"),
    ({"max_cost_usd": 0.01}, ["small", "not-in-router"], "options.max_cost_usd"),              # its last step unpriced
])
def test_a_cascade_ceiling_needs_a_router_that_prices_every_step(router_file, options, models, param):
    from link.policies.base import PolicyError

    config = {"scorer": "router", "path": str(router_file), **options} if options.get("scorer") != "judge" else options
    with pytest.raises(PolicyError) as info:
        CascadePolicy.check(PolicyConfig(name="c", type="cascade", models=models, options=config), (*MODELS, "not-in-router"))
    assert info.value.param == param
