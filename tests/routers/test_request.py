"""`RoutingRequest`: an OpenAI request read once for routing, and a decision that reads its text once."""

from __future__ import annotations

import numpy as np
import pytest

import routers.request
from routers.base import LoadedRouter
from routers.decision import CostModel
from routers.features import Featurizer
from routers.request import RoutingRequest
from tests.routers.test_router_base import LengthEmbedder, ToyRouter, toy_data


def test_from_body_reads_a_chat_request():
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
                         {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": [{"type": "text", "text": "second"}]}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "max_tokens": 50, "max_completion_tokens": 20,
            "metadata": {"suite": "gsm8k", "link_cost_penalty": "5"}}
    request = RoutingRequest.from_body(body, cost_penalty=5.0, max_cost_usd=0.01)
    assert request == RoutingRequest("second", "chat", 2, True, 20.0, "gsm8k", 5.0, 0.01)


def test_from_body_reads_a_completion_request():
    request = RoutingRequest.from_body({"prompt": ["one", "two"], "max_tokens": True, "functions": []})
    assert request == RoutingRequest("one", "completion", 1, False, None, None, None, None)
    assert RoutingRequest.of(request) is request


@pytest.mark.parametrize("kwargs, message", [({"endpoint": "embeddings"}, "endpoint"),
                                             ({"num_user_turns": 0}, "num_user_turns"),
                                             ({"cost_penalty": -1.0}, "cost_penalty"),
                                             ({"max_cost_usd": float("nan")}, "max_cost_usd")])
def test_a_request_checks_its_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RoutingRequest("text", **kwargs)


def test_a_decision_reads_the_request_text_once(monkeypatch):
    calls = []
    real = routers.request.request_text
    monkeypatch.setattr(routers.request, "request_text", lambda body: calls.append(1) or real(body))
    data = toy_data()
    router = ToyRouter(data.models).fit(data, None)
    router.featurizer = Featurizer(LengthEmbedder())
    costs = CostModel(data.models, [0.0] * 3, [1000.0] * 3, [100.0, 10.0, 1.0], [0.0] * 3)
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
    decision = LoadedRouter(router, costs).decide(RoutingRequest.from_body(body, cost_penalty=1.0))
    assert len(calls) == 1                                   # features, expected cost and rule share one parse
    assert decision.expected_cost == pytest.approx(dict(zip(data.models, np.array([0.005, 0.005, 0.001]))))
    assert decision.knob == 1.0
