"""Speculative decoding through the engine server: usage details on a real HTTP request and the
acceptance metrics on /metrics (SmolLM2-135M-Instruct, n-gram drafting)."""

from __future__ import annotations

import gzip
import json
import re

import httpx
import openai
import pytest

from serving.api.server import create_engine_app
from serving.engine.llm_engine import EngineConfig
from serving.spec_decode import SpeculativeConfig
from tests.serving.loopback import serve_on_loopback

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def spec_server(smollm2):
    config = EngineConfig(kv_cache_bytes=48 * 2**20, tuned_kernels=False, speculative=SpeculativeConfig())
    with serve_on_loopback(create_engine_app(MODEL, loaded=smollm2.loaded, engine_config=config)) as url:
        yield url


@pytest.fixture(scope="module")
def edit_request(data_dir) -> list[dict]:
    with gzip.open(data_dir / "human-eval/HumanEval.jsonl.gz", "rt") as f:
        problem = json.loads(f.readline())
    code = problem["prompt"] + problem["canonical_solution"]
    return [{"role": "user", "content": f"Repeat this code unchanged, then stop:\n\n```python\n{code}```"}]


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_usage_details_and_metrics_report_accepted_drafts(spec_server, edit_request):
    client = openai.OpenAI(base_url=spec_server + "/v1", api_key="unused", max_retries=0, timeout=300)
    whole = client.chat.completions.create(model=MODEL, messages=edit_request, temperature=0, max_tokens=32)
    details = whole.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert details.accepted_prediction_tokens < whole.usage.completion_tokens  # each step emits one token of its own
    assert details.rejected_prediction_tokens >= 0
    chunks = list(client.chat.completions.create(model=MODEL, messages=edit_request, temperature=0, max_tokens=32,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    streamed = chunks[-1].usage
    assert streamed.completion_tokens == whole.usage.completion_tokens
    # Greedy: the same tokens, though not always the same drafts (whether a step drafts depends on the
    # measured step times, `serving.spec_decode.step_cost`); /metrics sums both requests' counts.
    metrics = httpx.get(spec_server + "/metrics").text
    drafted = _metric(metrics, "link_engine_spec_draft_tokens_total")
    accepted = _metric(metrics, "link_engine_spec_accepted_tokens_total")
    both = (details, streamed.completion_tokens_details)
    assert accepted == sum(d.accepted_prediction_tokens for d in both)
    assert drafted == accepted + sum(d.rejected_prediction_tokens for d in both)
    num_drafting = sum(1 for d in both if d.accepted_prediction_tokens + d.rejected_prediction_tokens)  # 1 or 2
    assert _metric(metrics, "link_engine_spec_acceptance_rate_count") == num_drafting
    assert _metric(metrics, "link_engine_spec_draft_length_count") == num_drafting
    assert 0 < _metric(metrics, "link_engine_spec_acceptance_rate_sum") <= num_drafting


def test_sampled_n2_requests_speculate_and_finish(spec_server):
    client = openai.OpenAI(base_url=spec_server + "/v1", api_key="unused", max_retries=0, timeout=300)
    out = client.completions.create(model=MODEL, prompt="a b c a b c a b c a b", n=2, temperature=0.9, seed=5, max_tokens=12)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage.completion_tokens == 24
    assert out.usage.completion_tokens_details.accepted_prediction_tokens >= 0
