"""One routing objective: `routers.decision.rank`, the router and hybrid policies and offline evaluation's
sweep, fed the same predicted qualities, expected costs and knob, give the same order.

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

from link.config import PolicyConfig
from link.policies.hybrid import MOA, HybridPolicy
from link.policies.router import RouterPolicy
from routers.base import ROUTERS
from routers.decision import rank
from routers.offline.calibration import sweep
from routers.request import RoutingRequest
from tests.link.router_fakes import COSTS, PLAIN, TableRouter, save_table_router

MODELS = ["small", "big", "down", "moa-col"]
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
def test_the_policies_offline_evaluation_and_rank_give_one_order(router_policy, hybrid_policy, cost_penalty, max_cost,
                                                                expected, over):
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
