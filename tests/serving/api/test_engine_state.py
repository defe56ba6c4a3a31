"""`GET /v1/engine/state` (serving/engine/cache_state.py) on the toy model's engine server: the block size, the
prefix cache's blocks and hit counts, and the queue, checked against counts worked out by hand from the block
manager's rules; and the gateway's reader of that body (link/replica_state.py)."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from link.replica_state import ReplicaLoad, parse_engine_state
from serving.api.server import create_engine_app
from tests.serving.loopback import serve_on_loopback
from tests.serving.toy_model import TOY_ENGINE, toy_chat_model

NAME = "toy-state"
CONFIG = dataclasses.replace(TOY_ENGINE, auto_tune=False)
PROMPT = "abcdefghij" * 5  # 50 characters = 50 tokens of the toy's character tokenizer


@pytest.fixture(scope="module")
def url():
    app = create_engine_app(NAME, loaded=toy_chat_model(NAME), engine_config=CONFIG)
    with serve_on_loopback(app) as url:
        yield url


def test_state_reports_block_size_cache_and_queue(url):
    fresh = httpx.get(url + "/v1/engine/state").json()
    assert fresh == {"block_size": 16, "num_blocks": 256, "num_free_blocks": 256, "num_cached_blocks": 0,
                     "enable_prefix_caching": True, "prefix_cache_queries": 0, "prefix_cache_hits": 0,
                     "num_running": 0, "num_waiting": 0, "prefix_cache_hit_rate": 0.0}
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    for _ in range(2):
        assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 200
    state = httpx.get(url + "/v1/engine/state").json()
    # 50 prompt tokens per request: the first registers floor(50 / 16) = 3 full blocks; the second finds the
    # blocks of its first floor((50 - 1) / 16) = 3 blocks cached: 48 of its 50 tokens. Both finished: all free.
    assert state == {**fresh, "num_cached_blocks": 3, "prefix_cache_queries": 100, "prefix_cache_hits": 48,
                     "prefix_cache_hit_rate": 0.48}
    assert parse_engine_state(state) == ReplicaLoad("link-engine", 0, 0, 16, 0.0, 0.48)


def test_engine_state_reader_refuses_another_body():
    with pytest.raises(ValueError, match="not an engine state body"):
        parse_engine_state({"status": "ok"})
