"""Targets: GatewayTarget against a real OpenAI-compatible mock on 127.0.0.1 and through the in-process gateway;
LiteLLMTarget (key check, a call to the mock); resolve_targets; error mapping; the cost header.

    .venv/bin/python -m pytest -q tests/evals/test_targets.py
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from evals.target_gateway import GatewayConnection, GatewayTarget, in_process_gateway
from evals.target_litellm import LiteLLMTarget
from evals.target_factory import resolve_targets
from evals.targets import MissingCredentialsError, Prices, TargetError
from link.config import load_config, parse_config
from tests.link.gateway_launch import gateway_settings, mock_deployment
from tests.link.mock_openai import refused_url

HI = [{"role": "user", "content": "hi there"}]
# The mock answers "You said: hi there": 2 prompt words, 4 completion words; mock_deployment prices: $1000 / $2000 per M.
EXPECTED_COST = (2 * 1000 + 4 * 2000) / 1e6


def _client(base_url: str, **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0, **kwargs)


def test_chat_and_completion_against_a_real_server(mock):
    async def go():
        async with _client(mock.api_base) as client:
            priced = GatewayTarget("mock-model", client, prices=Prices(1000.0, 2000.0))
            chat = await priced.chat(HI, temperature=0, max_tokens=16)
            text = await GatewayTarget("mock-model", client).complete("one two three", max_tokens=2)
            return chat, text

    chat, text = asyncio.run(go())
    assert chat.text == "You said: hi there" and chat.finish_reason == "stop" and chat.model == "mock-model"
    assert (chat.prompt_tokens, chat.completion_tokens) == (2, 4) and chat.cost_usd == pytest.approx(EXPECTED_COST)
    assert chat.latency_s > 0
    assert text.text == "You said:" and text.finish_reason == "length" and text.cost_usd == 0.0  # no prices: 0
    assert mock.last_body()["max_tokens"] == 2


def test_tool_calls_are_returned_as_dicts(mock):
    tools = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]

    async def go():
        async with _client(mock.api_base) as client:
            return await GatewayTarget("mock-model", client).chat(HI, tools=tools)

    completion = asyncio.run(go())
    assert completion.finish_reason == "tool_calls" and completion.text == ""
    assert completion.tool_calls[0]["function"]["name"] == "echo"


@pytest.mark.parametrize("mode, retryable, status", [("500", True, 500), ("400", False, 400)])
def test_http_errors_are_mapped(mock, mode, retryable, status):
    async def go():
        async with _client(mock.api_base) as client:
            await GatewayTarget("mock-model", client).chat(HI, metadata={"mock_mode": mode})

    with pytest.raises(TargetError) as info:
        asyncio.run(go())
    assert info.value.retryable is retryable and info.value.status == status


def test_connection_errors_and_timeouts_are_retryable(mock):
    async def refused():
        async with _client(refused_url()) as client:
            await GatewayTarget("m", client).chat(HI)

    async def hang():
        async with _client(mock.api_base, timeout=0.3) as client:
            await GatewayTarget("mock-model", client).chat(HI, metadata={"mock_mode": "hang"})

    for call in (refused, hang):
        with pytest.raises(TargetError) as info:
            asyncio.run(call())
        assert info.value.retryable and info.value.status is None
        if call is refused:  # the URL and the reason, not "APIConnectionError: Connection error."
            assert str(info.value).startswith("cannot reach http://127.0.0.1:") and info.value.reason == "connection refused"


def _canned(status: int = 200, headers: dict | None = None, usage: dict | None = None) -> openai.AsyncOpenAI:
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "backend-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}}
    if status != 200:
        body = {"error": {"message": "slow down", "type": "rate_limit", "param": None, "code": None}}
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=body, headers=headers or {}))
    return _client("http://canned/v1", http_client=httpx.AsyncClient(transport=transport))


def test_cost_header_wins_over_prices():
    target = GatewayTarget("policy", _canned(headers={"x-link-cost-usd": "0.125", "x-link-model": "served"}),
                           prices=Prices(1e6, 1e6), model_prices={"served": Prices(1e6, 1e6)})
    completion = asyncio.run(target.chat(HI))
    assert completion.cost_usd == 0.125 and completion.model == "served"
    # Without the header: the prices of the model that answered (x-link-model), not the target's bound.
    target = GatewayTarget("policy", _canned(headers={"x-link-model": "cheap"}), prices=Prices(1e6, 1e6),
                           model_prices={"cheap": Prices(1.0, 2.0)})
    assert asyncio.run(target.chat(HI)).cost_usd == pytest.approx((10 * 1.0 + 20 * 2.0) / 1e6)


def test_a_multi_call_answer_is_charged_its_billed_tokens_and_cost():
    """A MoA or cascade answer's `usage` is its final call's; `usage.link_billed` holds every call's tokens and cost."""
    usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30,
             "link_billed": {"prompt_tokens": 35, "completion_tokens": 60, "total_tokens": 95, "cost_usd": 0.5, "calls": 3}}
    completion = asyncio.run(GatewayTarget("moa", _canned(usage=usage), prices=Prices(1e6, 1e6)).chat(HI))
    assert (completion.prompt_tokens, completion.completion_tokens, completion.cost_usd) == (35, 60, 0.5)
    header = GatewayTarget("moa", _canned(usage=usage, headers={"x-link-cost-usd": "0.25"}))
    assert asyncio.run(header.chat(HI)).cost_usd == 0.25   # the header still wins


def test_a_moa_through_the_in_process_gateway_is_charged_every_call(mock, tmp_path, new_database_url):
    from routers.moa import SYNTHESIS_PROMPT

    config = parse_config({"models": [mock_deployment("mock", mock.api_base)],
                           "policies": [{"name": "moa", "type": "moa", "models": ["mock"], "options": {"aggregator": "mock"}}]})

    async def go():
        async with in_process_gateway(settings, config) as gateway:
            (target,) = resolve_targets(["moa"], gateway.cards, gateway.client, prices=gateway.prices)
            return await target.chat(HI, max_tokens=16)

    settings = gateway_settings(new_database_url("sqlite"), tmp_path)
    completion = asyncio.run(go())
    # the proposer reads "hi there" (2) and answers "You said: hi there" (4); the aggregator reads the synthesis
    # instruction holding that answer, then "hi there", and answers the same 4 words
    instruction = len(f"{SYNTHESIS_PROMPT}\n\nAnswer 1:\nYou said: hi there".split())
    assert (completion.prompt_tokens, completion.completion_tokens) == (2 + instruction + 2, 4 + 4)
    assert completion.cost_usd == pytest.approx(((4 + instruction) * 1000 + 8 * 2000) / 1e6, rel=1e-9)


@pytest.mark.parametrize("status, retryable", [(429, True), (503, True), (401, False), (404, False)])
def test_status_codes(status, retryable):
    with pytest.raises(TargetError) as info:
        asyncio.run(GatewayTarget("m", _canned(status)).chat(HI))
    assert info.value.status == status and info.value.retryable is retryable


def test_in_process_gateway_serves_models_and_policies(mock, tmp_path, new_database_url):
    config = parse_config({"models": [mock_deployment("mock", mock.api_base), mock_deployment("mock-b", mock.api_base,
                                                                                              input_cost_per_million=5000.0)],
                           "policies": [{"name": "fb", "type": "fallback", "models": ["mock", "mock-b"]}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path)

    async def go():
        async with in_process_gateway(settings, config) as gateway:
            assert {"mock", "mock-b", "fb"} <= set(gateway.cards)
            model, policy = resolve_targets(["mock", "fb"], gateway.cards, gateway.client, prices=gateway.prices)
            with pytest.raises(ValueError, match="serves fb, mock, mock-b"):
                resolve_targets(["nonexistent"], gateway.cards, gateway.client)
            return model, policy, await model.chat(HI, max_tokens=16), await policy.chat(HI, max_tokens=16)

    model, policy, direct, routed = asyncio.run(go())
    assert isinstance(model, GatewayTarget) and model.prices == Prices(1000.0, 2000.0)
    assert policy.prices == Prices(5000.0, 2000.0)  # the bound over the policy's candidates
    assert direct.text == "You said: hi there" and direct.cost_usd == pytest.approx(EXPECTED_COST)
    assert routed.model == "mock" and routed.cost_usd == pytest.approx(EXPECTED_COST)  # charged at the served model's prices


def test_auto_style_follows_the_chat_format():
    # smollm2 (chat template) and gemma-3-270m (in-context, a base model; registered, configured here)
    config = parse_config({"models": [{"name": "smollm2-135m-instruct", "kind": "local", "local": "smollm2-135m-instruct"},
                                      {"name": "gemma-3-270m", "kind": "local", "local": "gemma-3-270m"}]})
    cards = {"smollm2-135m-instruct": {"link": {"type": "model"}}, "gemma-3-270m": {"link": {"type": "model"}},
             "both": {"link": {"type": "policy", "models": ["smollm2-135m-instruct", "gemma-3-270m"]}},
             "base-only": {"link": {"type": "policy", "models": ["gemma-3-270m"]}},
             "remote": {"link": {"type": "model", "chat_format": "in-context"}}}
    connection = GatewayConnection(client=None, cards=cards, config=config)
    assert connection.style_for("smollm2-135m-instruct") == "chat"
    assert connection.style_for("gemma-3-270m") == "completion"
    assert connection.style_for("both") == "chat" and connection.style_for("base-only") == "completion"
    assert connection.style_for("remote") == "completion"  # a card that states its chat format


def test_missing_key_is_named_before_any_call(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingCredentialsError, match="OPENAI_API_KEY"):
        LiteLLMTarget("openai/gpt-4o")
    with pytest.raises(MissingCredentialsError, match="OPENAI_API_KEY"):
        resolve_targets(["openai/gpt-4o"], {}, client=None)
    with pytest.raises(MissingCredentialsError, match="ANTHROPIC_API_KEY"):
        LiteLLMTarget("anthropic/claude-3-5-sonnet-20240620")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-a-real-key")
    target = LiteLLMTarget("openai/gpt-4o")
    assert target.prices is not None and target.prices.input_per_million > 0  # from LiteLLM's bundled price map


def test_litellm_target_calls_an_openai_compatible_server(mock):
    target = LiteLLMTarget("openai/mock-model", api_base=mock.api_base, api_key="sk-test")
    completion = asyncio.run(target.chat(HI, max_tokens=16, temperature=0))
    assert completion.text == "You said: hi there" and (completion.prompt_tokens, completion.completion_tokens) == (2, 4)
    assert completion.cost_usd == 0.0  # "mock-model" has no price anywhere


@pytest.mark.slow
def test_top_logprobs_from_the_real_engine(tmp_path, new_database_url):
    """Logprobs of a real local model through the gateway: the greedy token is its own likeliest alternative,
    in both APIs, and every alternative is a log-probability (<= 0)."""
    config = parse_config({"models": [{"name": "smollm2-135m-instruct", "kind": "local", "local": "smollm2-135m-instruct"}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path)
    prompt = "Question: Which is a fruit?\nA. car\nB. apple\nC. rock\nD. pen\nAnswer:"

    async def go():
        async with in_process_gateway(settings, config) as gateway:
            target = GatewayTarget("smollm2-135m-instruct", gateway.client)
            text = await target.complete("The capital of France is", max_tokens=1, temperature=0, logprobs=5)
            chat = await target.chat([{"role": "user", "content": prompt}], max_tokens=2, temperature=0,
                                     logprobs=True, top_logprobs=3)
            plain = await target.chat([{"role": "user", "content": prompt}], max_tokens=1, temperature=0)
            return text, chat, plain

    text, chat, plain = asyncio.run(go())
    assert len(text.top_logprobs) == 1 and len(text.top_logprobs[0]) == 5
    assert len(chat.top_logprobs) == 2 and all(len(p) == 3 for p in chat.top_logprobs)
    for completion in (text, chat):
        first = completion.top_logprobs[0]
        assert all(v <= 0 for v in first.values())
        # the greedy token has the highest log-probability (bfloat16 logits can tie: any of the best ones)
        best = max(first.values())
        assert any(completion.text.startswith(token) and value == best for token, value in first.items()), first
    assert plain.top_logprobs is None
