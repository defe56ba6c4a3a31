"""The response cache (link/response_cache.py) through a real gateway on loopback over the mock OpenAI backend,
counting the backend's calls exactly: hits, bypasses, namespaces, streams replayed from whole answers, single
flight under 200 concurrent requests, budgets at cost 0, semantic near-duplicates and the guard, TTL, Redis.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_response_cache.py
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import openai
import pytest
from sqlmodel import Session

from link.accounting import max_request_cost
from link.keys import create_key, get_key
from tests.link.gateway_launch import (MASTER_KEY, gateway_settings, logged_request, mock_deployment,
                                       start_gateway_thread)
from tests.link.mock_launch import free_port, start_mock_thread

# mock_deployment's prices: $1000 / $2000 per million prompt / completion tokens
PROMPT_USD, COMPLETION_USD = 1000 / 1e6, 2000 / 1e6
POLICIES = [
    {"name": "cached", "type": "fixed", "models": ["m"], "options": {"cache": {"mode": "exact"}}},
    {"name": "cached-shared", "type": "fixed", "models": ["m"], "options": {"cache": {"mode": "exact", "shared": True}}},
    {"name": "cached-ttl", "type": "fixed", "models": ["m"], "options": {"cache": {"mode": "exact", "ttl_s": 0.5}}},
    {"name": "cached-semantic", "type": "fixed", "models": ["m"],
     "options": {"cache": {"mode": "semantic", "similarity": 0.9}}},
    {"name": "cached-loose", "type": "fixed", "models": ["m"],   # a low threshold: only the guard tells names apart
     "options": {"cache": {"mode": "semantic", "similarity": 0.7}}},
]


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread() as server:
        yield server


@pytest.fixture(scope="module")
def db_url(new_database_url):
    from link.db import upgrade

    url = new_database_url("sqlite")
    upgrade(url)
    return url


@pytest.fixture(scope="module")
def engine(db_url):
    from link.db import make_db_engine

    engine = make_db_engine(db_url)
    yield engine
    engine.dispose()


def _config(mock):
    from link.config import parse_config

    return parse_config({"models": [mock_deployment("m", mock.api_base)], "policies": POLICIES})


@pytest.fixture(scope="module")
def gateway(db_url, mock, tmp_path_factory):
    with start_gateway_thread(gateway_settings(db_url, tmp_path_factory.mktemp("home")), _config(mock)) as server:
        yield server


def _key(engine, name: str, budget_usd: float | None = None) -> tuple[int, str]:
    with Session(engine) as session:
        key, plaintext = create_key(session, name, budget_usd=budget_usd)
    return key.id, plaintext


def _spend(engine, key_id: int) -> tuple[float, float]:
    """(spend_usd, reserved_usd), once nothing is reserved (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        with Session(engine) as session:
            key = get_key(session, key_id)
        if key.reserved_usd == 0 or time.monotonic() > deadline:
            return key.spend_usd, key.reserved_usd
        time.sleep(0.05)


def _calls(mock) -> int:
    return mock.stats()["requests"]


def _post(gateway, body: dict, key: str = MASTER_KEY, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(gateway.base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _chat(model: str, text: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0, **fields}


def _unique(text: str) -> str:
    return f"{text} {uuid.uuid4().hex[:8]}"


def test_second_identical_request_is_a_hit_at_cost_zero(gateway, mock, engine):
    key_id, key = _key(engine, "cache-hit", budget_usd=10.0)
    body = _chat("cached", _unique("hello there"), max_tokens=20)
    before = _calls(mock)
    first, second = _post(gateway, body, key), _post(gateway, body, key)
    assert _calls(mock) - before == 1
    assert first.status_code == second.status_code == 200
    assert first.headers["x-link-cache"] == "miss" and second.headers["x-link-cache"] == "hit"
    a, b = first.json(), second.json()
    assert b["choices"][0]["message"] == a["choices"][0]["message"]
    # the original's token counts, marked; the mock counts words: 3 prompt words, "You said: hello there <hex>"
    assert a["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert b["usage"] == {**a["usage"], "link_cache": "hit"}
    assert b["id"] != a["id"] and b["model"] == a["model"] == "m"
    cost = 3 * PROMPT_USD + 5 * COMPLETION_USD
    assert float(first.headers["x-link-cost-usd"]) == pytest.approx(cost)
    assert float(second.headers["x-link-cost-usd"]) == 0.0
    miss_row = logged_request(gateway, first.headers["x-link-request-id"])
    hit_row = logged_request(gateway, second.headers["x-link-request-id"])
    assert miss_row["cost_usd"] == pytest.approx(cost) and miss_row["decision"]["cache"]["outcome"] == "miss"
    assert hit_row["cost_usd"] == 0 and hit_row["status"] == "ok" and hit_row["model"] == "m"
    assert hit_row["decision"]["cache"]["outcome"] == "hit" and hit_row["decision"]["cache"]["kind"] == "exact"
    assert hit_row["prompt_tokens"] == hit_row["completion_tokens"] == 0
    assert _spend(engine, key_id) == (pytest.approx(cost), 0.0)   # the budget was charged once


def test_completions_are_cached_too(gateway, mock):
    body = {"model": "cached", "prompt": _unique("complete this"), "temperature": 0, "max_tokens": 10}
    before = _calls(mock)
    first = _post(gateway, body, path="/completions")
    second = _post(gateway, {**body, "temperature": 0.0, "stream": False}, path="/completions")  # 0.0 keys as 0
    assert _calls(mock) - before == 1
    assert second.headers["x-link-cache"] == "hit"
    assert second.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert second.json()["object"] == "text_completion"


def test_temperature_above_zero_without_seed_is_never_cached(gateway, mock):
    body = _chat("cached", _unique("random please"), temperature=0.7)
    before = _calls(mock)
    responses = [_post(gateway, body) for _ in range(2)]
    assert _calls(mock) - before == 2
    assert [r.headers["x-link-cache"] for r in responses] == ["bypass", "bypass"]
    seeded = {**body, "seed": 7}   # a seed makes the answer reproducible: cached
    assert [_post(gateway, seeded).headers["x-link-cache"] for _ in range(2)] == ["miss", "hit"]
    assert _calls(mock) - before == 3


def test_a_hit_across_keys_only_when_shared(gateway, mock, engine):
    _, alice = _key(engine, "alice")
    _, bob = _key(engine, "bob")
    text = _unique("same question")
    before = _calls(mock)
    assert _post(gateway, _chat("cached", text), alice).headers["x-link-cache"] == "miss"
    assert _post(gateway, _chat("cached", text), bob).headers["x-link-cache"] == "miss"   # its own namespace
    assert _calls(mock) - before == 2
    assert _post(gateway, _chat("cached-shared", text), alice).headers["x-link-cache"] == "miss"
    assert _post(gateway, _chat("cached-shared", text), bob).headers["x-link-cache"] == "hit"
    assert _calls(mock) - before == 3


def test_a_stream_is_served_from_a_whole_answer_and_back(gateway, mock):
    client = openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0)
    text = _unique("stream me this answer")
    before = _calls(mock)
    whole = client.chat.completions.create(model="cached", messages=[{"role": "user", "content": text}], temperature=0)
    raw = client.chat.completions.with_raw_response.create(
        model="cached", messages=[{"role": "user", "content": text}], temperature=0, stream=True,
        stream_options={"include_usage": True})
    assert raw.headers["x-link-cache"] == "hit"
    chunks = list(raw.parse())
    assert _calls(mock) - before == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    # the gateway's stream shape: a role chunk, a chunk per word, a finish chunk, the usage chunk
    words = whole.choices[0].message.content.split(" ")
    assert chunks[0].choices[0].delta.role == "assistant" and len(chunks) == 1 + len(words) + 1 + 1
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.model_extra["link_cache"] == "hit"
    # a streamed miss is kept whole: the next whole request is a hit with the same text
    other = _unique("first streamed")
    streamed = client.chat.completions.create(model="cached", messages=[{"role": "user", "content": other}],
                                              temperature=0, stream=True)
    streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    again = client.chat.completions.with_raw_response.create(model="cached", temperature=0,
                                                             messages=[{"role": "user", "content": other}])
    assert again.headers["x-link-cache"] == "hit"
    assert again.parse().choices[0].message.content == streamed_text
    assert _calls(mock) - before == 2


async def _many(gateway, body: dict, key: str, num: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=num, max_keepalive_connections=num)
    async with httpx.AsyncClient(base_url=gateway.base_url, limits=limits, timeout=60,
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        return await asyncio.gather(*(client.post("/chat/completions", json=body) for _ in range(num)))


def test_200_concurrent_identical_requests_make_one_backend_call(gateway, mock):
    body = _chat("cached", _unique("all at once"))
    before = _calls(mock)
    responses = asyncio.run(_many(gateway, body, MASTER_KEY, 200))
    assert _calls(mock) - before == 1
    assert all(r.status_code == 200 for r in responses)
    assert sorted(r.headers["x-link-cache"] for r in responses) == ["hit"] * 199 + ["miss"]
    assert len({r.json()["choices"][0]["message"]["content"] for r in responses}) == 1


def test_a_small_budget_is_never_exceeded(gateway, mock, engine):
    body = _chat("cached", _unique("budget"), max_tokens=4)
    max_cost = max_request_cost("chat", body, gateway.state.config.deployments("m"))
    budget = 3 * max_cost   # at most three reservations in flight at once
    key_id, key = _key(engine, "small-budget", budget_usd=budget)
    before = _calls(mock)
    responses = asyncio.run(_many(gateway, body, key, 200))
    assert _calls(mock) - before == 1
    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert served and all(r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota" for r in refused)
    cost = 2 * PROMPT_USD + 4 * COMPLETION_USD   # "budget <hex>" -> "You said: budget <hex>", 4 words
    assert _spend(engine, key_id) == (pytest.approx(cost), 0.0) and cost <= budget
    # once the first answer is paid for, every repeat is served, at cost 0, one at a time or all at once
    assert all(_post(gateway, body, key).headers["x-link-cache"] == "hit" for _ in range(5))
    assert _spend(engine, key_id) == (pytest.approx(cost), 0.0)
    assert _calls(mock) - before == 1


def test_semantic_near_duplicates_hit_and_changed_numbers_or_names_do_not(gateway, mock):
    embedder = gateway.state.response_cache.embedder()
    tag = uuid.uuid4().hex[:6]   # a system message of its own: no earlier test's entry shares the group
    system = {"role": "system", "content": f"Session {tag}."}

    def ask(text: str, policy: str = "cached-semantic") -> httpx.Response:
        return _post(gateway, {"model": policy, "temperature": 0, "messages": [system, {"role": "user", "content": text}]})

    def similarity(a: str, b: str) -> float:
        vectors = embedder.embed([a, b])
        return float(vectors[0] @ vectors[1])

    original, paraphrase = "Translate good morning into Spanish.", "Translate good morning to Spanish."
    numbers = ("Give me three ideas for a birthday party.", "Give me five ideas for a birthday party.")
    names = ("Write a short biography of Marie Curie.", "Write a short biography of Pierre Curie.")
    # the embedding alone would call each pair a hit under its policy's threshold: the guard tells them apart
    assert similarity(original, paraphrase) >= 0.97 and similarity(*numbers) >= 0.9 and similarity(*names) >= 0.7
    before = _calls(mock)
    first = ask(original)
    assert first.headers["x-link-cache"] == "miss"
    near = ask(paraphrase)
    assert near.headers["x-link-cache"] == "hit"
    assert near.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert [ask(text).headers["x-link-cache"] for text in numbers] == ["miss", "miss"]   # "five" is not "three"
    assert [ask(text, "cached-loose").headers["x-link-cache"] for text in names] == ["miss", "miss"]  # Pierre, Marie
    assert _calls(mock) - before == 5
    row = logged_request(gateway, near.headers["x-link-request-id"])
    assert row["decision"]["cache"]["kind"] == "semantic" and row["decision"]["cache"]["similarity"] >= 0.9


def test_entries_expire_after_their_ttl(gateway, mock):
    body = _chat("cached-ttl", _unique("short lived"))
    before = _calls(mock)
    assert [_post(gateway, body).headers["x-link-cache"] for _ in range(2)] == ["miss", "hit"]
    time.sleep(0.6)
    assert _post(gateway, body).headers["x-link-cache"] == "miss"
    assert _calls(mock) - before == 2


def test_anthropic_messages_are_served_from_the_cache(gateway, mock):
    body = {"model": "cached", "max_tokens": 20, "temperature": 0,
            "messages": [{"role": "user", "content": _unique("anthropic hello")}]}
    headers = {"x-api-key": MASTER_KEY, "anthropic-version": "2023-06-01"}
    before = _calls(mock)
    first, second = [httpx.post(gateway.url + "/v1/messages", json=body, headers=headers, timeout=30) for _ in range(2)]
    assert _calls(mock) - before == 1 and second.headers["x-link-cache"] == "hit"
    assert second.json()["content"] == first.json()["content"] and second.json()["type"] == "message"


def test_redis_storage_and_an_outage_that_only_misses(db_url, mock, redis_url, unique_prefix, tmp_path):
    import redis

    settings = gateway_settings(db_url, tmp_path / "redis", redis_url=redis_url, cache_redis_prefix=unique_prefix)
    client = redis.Redis.from_url(redis_url)
    try:
        with start_gateway_thread(settings, _config(mock)) as gateway:
            body = _chat("cached", _unique("kept in redis"))
            before = _calls(mock)
            assert [_post(gateway, body).headers["x-link-cache"] for _ in range(2)] == ["miss", "hit"]
            assert _calls(mock) - before == 1
            keys = client.keys(f"{unique_prefix}:*")
            assert len(keys) == 1 and 0 < client.pttl(keys[0]) <= 300_000
    finally:
        for key in client.scan_iter(f"{unique_prefix}:*"):
            client.delete(key)
        client.close()
    down = gateway_settings(db_url, tmp_path / "down", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with start_gateway_thread(down, _config(mock)) as gateway:
        body = _chat("cached", _unique("redis is down"))
        before = _calls(mock)
        responses = [_post(gateway, body) for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert [r.headers["x-link-cache"] for r in responses] == ["miss"] * 3
        assert _calls(mock) - before == 3


@pytest.mark.parametrize("cache,param", [
    ("yes", "options.cache"), ({"ttl_s": 5}, "options.cache.mode"), ({"mode": "fuzzy"}, "options.cache.mode"),
    ({"mode": "exact", "ttl_s": 0}, "options.cache.ttl_s"), ({"mode": "semantic", "similarity": 1.5}, "options.cache.similarity"),
    ({"mode": "exact", "shared": "yes"}, "options.cache.shared"), ({"mode": "exact", "size": 3}, "options.cache.size"),
    ({"mode": "exact", "max_entries": 0}, "options.cache.max_entries")])
def test_cache_options_are_checked_strictly(cache, param):
    from link.config import PolicyConfig
    from link.policies import make_policy
    from link.policies.options import PolicyError

    with pytest.raises(PolicyError) as refused:
        make_policy(PolicyConfig(name="p", type="fixed", models=["m"], options={"cache": cache}), ["m"])
    assert refused.value.param == param
    policy = make_policy(PolicyConfig(name="p", type="fixed", models=["m"], options={"cache": {"mode": "semantic"}}), ["m"])
    assert (policy.cache.mode, policy.cache.ttl_s, policy.cache.similarity, policy.cache.is_shared) == ("semantic", 300.0, 0.97, False)
