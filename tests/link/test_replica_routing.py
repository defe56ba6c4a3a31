"""Cache-aware replica routing (link/replica_routing.py, link/replica_state.py, `DeploymentPool.pick(body)`): the
chooser on hand-checked cases, the load read from fake vLLM servers' Prometheus pages on loopback, and a gateway
over two mock OpenAI servers keeping a shared long prefix on one replica while unrelated requests spread."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from link.backends import Backend, make_backend
from link.config import ModelDeployment, parse_config
from link.deployments import DeploymentPool
from link.replica_routing import CacheAwareRouter, PrefixIndex, chunk_hashes, load_bound, prompt_text
from link.replica_state import ReplicaLoad, parse_prometheus_load
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_openai import start_mock_thread
from tests.serving.loopback import serve_on_loopback

SYSTEM = "You are a careful assistant. " * 40  # 1,160 characters


def chat(question: str, system: str | None = SYSTEM) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"model": "m", "messages": messages}


# -- the prefix hashes ---------------------------------------------------------------------------------------------


def test_chunk_hashes_chain_blake2b_over_full_chunks_only():
    text = "a" * 64 + "b" * 64 + "c" * 10  # two full 64-character chunks and a partial one
    first = hashlib.blake2b(b"root" + b"a" * 64, digest_size=8).digest()
    second = hashlib.blake2b(first + b"b" * 64, digest_size=8).digest()
    assert chunk_hashes(text, 64) == [int.from_bytes(first, "little"), int.from_bytes(second, "little")]
    assert chunk_hashes(text, 64, max_chunks=1) == [int.from_bytes(first, "little")]
    other = chunk_hashes("a" * 64 + "x" * 64, 64)
    assert other[0] == chunk_hashes(text, 64)[0] and other[1] != chunk_hashes(text, 64)[1]  # chained: prefix only
    with pytest.raises(ValueError, match="chunk_chars"):
        chunk_hashes(text, 0)


def test_prompt_text_puts_tools_then_messages_as_sorted_json_lines():
    tool = {"type": "function", "function": {"name": "f"}}
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    assert prompt_text(body) == ('{"function":{"name":"f"},"type":"function"}\n'
                                 '{"content":"hi","role":"user"}\n')
    assert prompt_text({"prompt": "once upon"}) == "once upon"
    assert prompt_text({"prompt": ["first", "second"]}) == "first"
    assert prompt_text({"prompt": [1, 2, 3]}) == "[1,2,3]"
    assert prompt_text({}) == ""


@pytest.mark.parametrize("total, n, eps, bound", [
    (0, 2, 0.25, 1),   # ceil(1.25 * 1 / 2) = ceil(0.625)
    (6, 2, 0.25, 5),   # ceil(1.25 * 7 / 2) = ceil(4.375)
    (3, 2, 0.25, 3),   # ceil(1.25 * 4 / 2) = ceil(2.5)
    (3, 4, 0.0, 1),    # ceil(4 / 4): eps 0 is strict balance
    (49, 1, 0.1, 55),  # 1.1 * 50 = 55 exactly (55.00000000000001 in floats)
])
def test_load_bound_is_ceil_of_one_plus_eps_times_average(total, n, eps, bound):
    assert load_bound(total, n, eps) == bound


# -- the chooser ---------------------------------------------------------------------------------------------------


def test_the_same_prefix_goes_to_the_same_replica():
    router = CacheAwareRouter(eps=0.25)
    hashes = router.prefix_hashes(chat("What is 2 + 2?"))
    assert len(hashes) == 1234 // 64  # the system line (1,191 characters), the user line (43): 19 full chunks
    idle = [("a", 0), ("b", 0), ("c", 0)]
    first = router.choose(hashes, idle)  # nothing remembered: fewest in flight, ties in turn -> the first
    assert first == 0 and router.num_prefix_routed == 0
    router.record(hashes, "a")
    for question in ("Name a colour.", "Spell cat.", "What is 3 + 5?"):  # same system prompt, other questions
        again = router.prefix_hashes(chat(question))
        # shared: the system line and the user line's `{"content":"`, 1,203 characters = 18 full chunks
        assert router.index.matched(again) == {"a": 18}
        assert router.choose(again, [("a", 0), ("b", 0), ("c", 0)]) == 0  # bound ceil(1.25 / 3) = 1: a may take it
        assert router.choose(again, [("c", 0), ("b", 0), ("a", 0)]) == 2  # the replica, not the position
    assert router.num_prefix_routed == 6


def test_the_longest_remembered_prefix_wins():
    router = CacheAwareRouter()
    hashes = list(range(100, 110))
    router.record(hashes[:2], "a")
    router.record(hashes[:7], "b")
    assert router.index.matched(hashes) == {"a": 2, "b": 7}
    assert router.choose(hashes, [("a", 0), ("b", 1)]) == 1  # bound ceil(1.25 * 2 / 2) = 2: b (1 + 1) fits


def test_a_prefix_decides_only_when_it_saves_min_gain_chunks_over_the_least_loaded():
    router = CacheAwareRouter(eps=1.0, min_gain_chunks=4)
    header = [11, 12, 13]  # an opening every request shares (a template's wrapper, a few-shot header)
    router.record([*header, 21, 22, 23, 24, 25], "a")
    # a new subject: a remembers 3 chunks, b none: 3 < 4, so the least loaded (b) takes it and learns it
    assert router.index.matched([*header, 31, 32]) == {"a": 3}
    assert router.choose([*header, 31, 32], [("a", 1), ("b", 0)]) == 1 and router.num_prefix_routed == 0
    router.record([*header, 31, 32], "b")
    # a's subject again: a remembers 8, b 3: a gain of 5 sends it to a although a has more in flight
    assert router.choose([*header, 21, 22, 23, 24, 25], [("a", 1), ("b", 0)]) == 0 and router.num_prefix_routed == 1
    with pytest.raises(ValueError, match="min_gain_chunks"):
        CacheAwareRouter(min_gain_chunks=0)


def test_a_replica_over_the_load_bound_is_skipped():
    router = CacheAwareRouter(eps=0.25)
    hashes = [1, 2, 3, 4, 5]
    router.record(hashes, "a")
    # 3 + 0 in flight: bound ceil(1.25 * 4 / 2) = 3; a would hold 4 -> b, which has none of the prefix
    assert router.choose(hashes, [("a", 3), ("b", 0)]) == 1
    assert router.choose(hashes, [("a", 2), ("b", 0)]) == 1  # bound ceil(1.25 * 3 / 2) = 2: a would hold 3
    assert router.choose(hashes, [("a", 1), ("b", 0)]) == 0  # bound ceil(1.25 * 2 / 2) = 2: a may hold 2
    loose = CacheAwareRouter(eps=1.0)
    loose.record(hashes, "a")
    assert loose.choose(hashes, [("a", 3), ("b", 0)]) == 0  # bound ceil(2 * 4 / 2) = 4: a may hold 4


def test_no_shared_prefix_goes_to_the_fewest_in_flight():
    router = CacheAwareRouter()
    router.record([1, 2], "a")
    assert router.choose([9, 1, 2], [("a", 0), ("b", 2), ("c", 1)]) == 0  # first chunk differs: fewest (a, 0)
    assert router.choose([], [("a", 3), ("b", 2), ("c", 1)]) == 2  # a prompt shorter than a chunk
    picks = [router.choose([7], [("a", 0), ("b", 0)]) for _ in range(4)]
    assert picks == [0, 1, 0, 1]  # equal load: in turn (the turn counter stood at 2 after the two choices above)
    with pytest.raises(ValueError, match="no replica"):
        router.choose([1], [])


def test_prefix_index_is_a_bounded_lru():
    index = PrefixIndex(capacity=3)
    index.record([1, 2], "a")
    index.record([3, 4], "b")  # 4 entries > 3: hash 1, the least recently recorded, goes
    assert len(index) == 3 and index.matched([1, 2]) == {} and index.matched([3, 4]) == {"b": 2}
    index.record([2], "a")  # 2 becomes the most recent
    index.record([5], "c")  # evicts 3, now the least recent
    assert index.matched([3, 4]) == {} and index.matched([2]) == {"a": 1} and index.matched([4]) == {"b": 1}
    index.record([4], "c")  # one chain on two replicas
    assert index.matched([4]) == {"b": 1, "c": 1}
    index.forget("b")
    assert index.matched([4]) == {"c": 1} and index.num_entries("b") == 0
    with pytest.raises(ValueError):
        PrefixIndex(capacity=0)


def test_a_block_size_change_rehashes_and_forgets():
    router = CacheAwareRouter()
    body = chat("q")
    assert router.chunk_chars == 64
    router.record(router.prefix_hashes(body), "a")
    router.set_block_size(32)
    assert router.chunk_chars == 128 and len(router.index) == 0
    assert len(router.prefix_hashes(body)) == len(prompt_text(body)) // 128


# -- the pool ------------------------------------------------------------------------------------------------------


class FakeBackend(Backend):
    def __init__(self, name: str, routing: str = "cache_aware"):
        super().__init__(ModelDeployment(name="m", kind="openai", api_base="http://fake", deployment_id=name,
                                         replica_routing=routing))

    async def complete(self, endpoint, body):
        return {}

    async def stream(self, endpoint, body):
        yield {}

    async def health(self):
        return True


def test_pool_sticks_a_prefix_and_forgets_a_failed_replica():
    pool = DeploymentPool("m", [FakeBackend("a"), FakeBackend("b")])
    assert pool.router is not None and pool.router.eps == 0.25
    ids = [pool.pick(chat(f"question {i}")).deployment_id for i in range(4)]
    assert ids == ["a"] * 4  # the first by turn, the rest by the remembered system prompt
    assert [pool.pick(chat(f"unrelated {i} " * 20, system=None)).deployment_id for i in range(4)] == ["a", "b", "a", "b"]
    pool.report_failure(pool.replicas[0])  # ejected (failures_to_eject=1) and forgotten
    assert pool.pick(chat("question 9")).deployment_id == "b"
    assert DeploymentPool("m", [FakeBackend("a", "fewest_outstanding")]).router is None


# -- external replicas: load from vLLM's Prometheus names ----------------------------------------------------------


VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} 250.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="32",enable_prefix_caching="True",gpu_memory_utilization="0.9"}} 1.0
"""


def test_prometheus_pages_of_vllm_v0_v1_and_sglang():
    assert parse_prometheus_load(VLLM_PAGE.format(running=3, waiting=2, usage=0.5)) == ReplicaLoad("vllm", 3, 2, 32, 0.5, 0.25)
    v0 = ('vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 0\n'
          'vllm:gpu_cache_usage_perc{model_name="m"} 0.125\nvllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.75\n')
    assert parse_prometheus_load(v0) == ReplicaLoad("vllm", 1, 0, None, 0.125, 0.75)
    sglang = 'sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs{model_name="m"} 6\nsglang:token_usage{model_name="m"} 0.3\n'
    assert parse_prometheus_load(sglang) == ReplicaLoad("sglang", 4, 6, None, 0.3, None)
    assert parse_prometheus_load('link_gateway_requests_total{model="m"} 5\n') is None


def fake_vllm(load: dict) -> FastAPI:
    """/metrics with vLLM's names over `load` (mutable: running, waiting, usage), /health."""
    app = FastAPI()

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(VLLM_PAGE.format(**load))

    @app.get("/health")
    async def health():
        return {}

    return app


def test_pool_reads_vllm_load_and_routes_away_from_a_busy_replica():
    busy, idle = {"running": 12, "waiting": 5, "usage": 0.8}, {"running": 0, "waiting": 0, "usage": 0.0}
    with serve_on_loopback(fake_vllm(busy)) as busy_url, serve_on_loopback(fake_vllm(idle)) as idle_url:
        backends = [make_backend(ModelDeployment(name="m", kind="openai", api_base=url + "/v1", deployment_id=f"m#{i}",
                                                 replica_routing="cache_aware"))
                    for i, url in enumerate((busy_url, idle_url))]
        pool = DeploymentPool("m", backends)
        body = chat("What is 2 + 2?")

        async def go():
            await pool.poll_state()
            first = pool.status()
            pool.router.record(pool.router.prefix_hashes(body), "m#0")  # m#0 served this prefix before
            away = pool.pick(body).deployment_id
            busy.update(running=0, waiting=0, usage=0.1)  # the two swap: now m#1 is the busy one
            idle.update(running=12, waiting=5, usage=0.8)
            await pool.poll_state()
            back = pool.pick(body).deployment_id
            await pool.aclose()
            return first, away, back

        first, away, back = asyncio.run(go())
    assert first[0]["engine"] == {"source": "vllm", "running": 12, "waiting": 5, "block_size": 32, "kv_cache_usage": 0.8,
                                  "prefix_cache_hit_rate": 0.25}
    assert pool.router.block_size == 32  # from vllm:cache_config_info
    # m#0 holds 17 (reported) + 0 (ours): bound ceil(1.25 * 18 / 2) = 12 < 18, so the prefix goes to m#1 ...
    assert away == "m#1"
    assert back == "m#0"  # ... and, both holding it now, to m#0 once m#1 is the busy one


# -- through the gateway -------------------------------------------------------------------------------------------


def test_gateway_keeps_a_shared_prefix_on_one_replica_and_spreads_the_rest(new_database_url, tmp_path):
    with start_mock_thread() as one, start_mock_thread() as two:
        mocks = [one, two]
        config = parse_config({"models": [mock_deployment("rep", m.api_base, replica_routing="cache_aware") for m in mocks]})
        settings = gateway_settings(new_database_url("sqlite"), tmp_path, replica_state_interval_s=0.2)
        with start_gateway_thread(settings, config) as gateway, httpx.Client(timeout=30) as client:
            def send(body: dict) -> None:
                response = client.post(gateway.url + "/v1/chat/completions", json={**body, "model": "rep"},
                                       headers={"Authorization": f"Bearer {MASTER_KEY}"})
                assert response.status_code == 200, response.text

            for i in range(6):  # one at a time: every replica idle, so the load bound never binds
                send(chat(f"shared question {i}"))
            shared = [m.stats()["chat"] for m in mocks]
            for i in range(6):
                send(chat(f"an unrelated request number {i} " * 4, system=None))
            unrelated = [m.stats()["chat"] - s for m, s in zip(mocks, shared)]
            gateway.flush_log()
    assert sorted(shared) == [0, 6]  # the shared system prompt stuck to the replica that first served it
    assert unrelated == [3, 3]  # no shared prefix: fewest in flight (all idle), in turn


def test_gateway_over_two_toy_engines_sends_a_shared_prefix_to_the_engine_that_caches_it(new_database_url, tmp_path):
    """Real engine servers (the toy model: one token per character, 16-token blocks): the engine that got the shared
    system prompt first gets the rest, and its prefix cache serves them, as its /v1/engine/state counts."""
    import dataclasses

    from serving.api.server import create_engine_app
    from tests.serving.toy_model import TOY_ENGINE, toy_chat_model

    name, config = "toy-rr", dataclasses.replace(TOY_ENGINE, auto_tune=False)
    system = "Be brief. " * 30  # 300 characters
    with serve_on_loopback(create_engine_app(name, loaded=toy_chat_model(name), engine_config=config)) as a, \
            serve_on_loopback(create_engine_app(name, loaded=toy_chat_model(name), engine_config=config)) as b:
        entries = [{"name": "toy", "kind": "openai", "model": name, "api_base": url + "/v1", "replica_routing": "cache_aware"}
                   for url in (a, b)]
        settings = gateway_settings(new_database_url("sqlite"), tmp_path, replica_state_interval_s=0.1)
        with start_gateway_thread(settings, parse_config({"models": entries})) as gateway, httpx.Client(timeout=30) as client:
            for i in range(1, 5):
                response = client.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {MASTER_KEY}"},
                                       json={**chat(f"question {i}", system), "model": "toy", "max_tokens": 1})
                assert response.status_code == 200, response.text
            states = [httpx.get(url + "/v1/engine/state").json() for url in (a, b)]
            gateway.flush_log()
    # Each prompt renders as "system: {300}\nuser: question i\nassistant:", 336 characters = 336 tokens. The first
    # request registers floor(336 / 16) = 21 blocks; the next three share "system: ...\nuser: question " (324
    # tokens), so each finds floor(324 / 16) = 20 blocks cached: 3 x 320 hit tokens of 4 x 336 queried.
    assert [s["prefix_cache_queries"] for s in states] == [4 * 336, 0]
    assert states[0]["prefix_cache_hits"] == 3 * 320
