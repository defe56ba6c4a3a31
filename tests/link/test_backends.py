"""Backends against real servers: the remote ones against the mock OpenAI server on loopback (whole,
streamed, errors, timeouts, refused connections, mid-stream death), `LocalBackend` against the real
SmolLM2 model (one test). The local engines read kernel winners from an empty table of the test's own
(LINK_COMPILE_DB) and tune nothing in the background: no torch.compile warm-ups of winners that other tests stored in
the shared $LINK_HOME."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from link.backends import BackendError, BackendTimeout, BackendUnavailable, backend_class, make_backend
from link.config import ModelDeployment
from tests.link.mock_openai import refused_url, start_mock_thread

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REMOTE_KINDS = ["openai", "litellm"]
CHAT = {"messages": [{"role": "user", "content": "the quick brown fox"}]}
COMPLETION = {"prompt": "one two three"}


def run(coro):
    return asyncio.run(coro)


def deployment(kind: str, api_base: str, **fields) -> ModelDeployment:
    model = "openai/mock-model" if kind == "litellm" else "mock-model"
    return ModelDeployment(name="mock", kind=kind, model=model, api_base=api_base, **fields)


def body(kind: str, endpoint: str, **fields) -> dict:
    return {"model": "openai/mock-model" if kind == "litellm" else "mock-model", **(CHAT if endpoint == "chat" else COMPLETION), **fields}


@pytest.fixture
def mock_in_mode():
    """start(mode, **options) -> a fresh mock server in that mode, stopped after the test."""
    servers = []

    def start(mode: str, **options):
        servers.append(start_mock_thread(mode, **options))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


async def collect(backend, endpoint: str, request: dict) -> list[dict]:
    return [chunk async for chunk in backend.stream(endpoint, request)]


def text_of(response: dict, endpoint: str) -> str:
    choice = response["choices"][0]
    return choice["message"]["content"] if endpoint == "chat" else choice["text"]


def streamed_text(chunks: list[dict], endpoint: str) -> str:
    key = "delta" if endpoint == "chat" else None
    return "".join((c["choices"][0][key].get("content") or "") if key else (c["choices"][0]["text"] or "")
                   for c in chunks if c["choices"])


@pytest.mark.parametrize("kind", REMOTE_KINDS)
@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_whole_and_streamed_answers_agree_with_usage(mock, kind, endpoint):
    backend = make_backend(deployment(kind, mock.api_base))

    async def go():
        whole = await backend.complete(endpoint, body(kind, endpoint, max_tokens=4))
        chunks = await collect(backend, endpoint, body(kind, endpoint, max_tokens=4, stream_options={"include_usage": True}))
        await backend.aclose()
        return whole, chunks

    whole, chunks = run(go())
    expected = "You said: the quick" if endpoint == "chat" else "You said: one two"
    assert text_of(whole, endpoint) == expected and whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["prompt_tokens"] == (4 if endpoint == "chat" else 3) and whole["usage"]["completion_tokens"] == 4
    assert streamed_text(chunks, endpoint) == expected
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == whole["usage"]["total_tokens"]
    assert all(isinstance(c, dict) for c in chunks)
    if endpoint == "chat":
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "provider_specific_fields" not in whole["choices"][0]["message"]


async def raised(awaitable) -> BackendError:
    with pytest.raises(BackendError) as info:
        await awaitable
    return info.value


@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_provider_400_passes_its_error_object_and_is_not_retryable(mock_in_mode, kind):
    backend = make_backend(deployment(kind, mock_in_mode("400").api_base))

    async def go():
        return [await raised(backend.complete("chat", body(kind, "chat"))), await raised(collect(backend, "chat", body(kind, "chat")))]

    for err in run(go()):
        assert type(err) is BackendError and err.status_code == 400 and not err.retryable
        assert err.to_openai()["error"] == {"message": "mock bad request: the messages are not acceptable",
                                            "type": "invalid_request_error", "param": "messages", "code": "mock_bad_request"}


@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_provider_500_is_retryable(mock_in_mode, kind):
    backend = make_backend(deployment(kind, mock_in_mode("500").api_base))

    async def go():
        errors = [await raised(backend.complete("completion", body(kind, "completion"))),
                  await raised(collect(backend, "completion", body(kind, "completion")))]
        return errors, await backend.health()

    errors, healthy = run(go())
    assert all(e.status_code == 500 and e.retryable for e in errors)
    assert healthy is False  # the mock's /health answers 503 in mode 500


@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_hanging_backend_times_out_on_first_token_and_whole_request(mock_in_mode, kind):
    backend = make_backend(deployment(kind, mock_in_mode("hang").api_base, timeout_s=1.0, first_token_timeout_s=0.4))
    start = time.monotonic()
    with pytest.raises(BackendTimeout, match="no first chunk within 0.4 s") as info:
        run(collect(backend, "chat", body(kind, "chat")))
    assert 0.35 < time.monotonic() - start < 0.9 and info.value.retryable and info.value.status_code == 504
    start = time.monotonic()
    with pytest.raises(BackendTimeout):
        run(backend.complete("chat", body(kind, "chat")))
    assert 0.9 < time.monotonic() - start < 1.6


@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_refused_connection_is_unavailable(kind):
    backend = make_backend(deployment(kind, refused_url()))
    with pytest.raises(BackendUnavailable) as info:
        run(backend.complete("chat", body(kind, "chat")))
    assert info.value.retryable and info.value.status_code == 503
    with pytest.raises(BackendUnavailable):
        run(collect(backend, "chat", body(kind, "chat")))
    assert run(backend.health()) is False


@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_stream_that_dies_midway_raises_after_its_chunks(mock_in_mode, kind):
    backend = make_backend(deployment(kind, mock_in_mode("die", die_after=3).api_base))
    received = []

    async def go():
        async for chunk in backend.stream("chat", body(kind, "chat")):
            received.append(chunk)

    with pytest.raises(BackendUnavailable, match="after 3 chunks"):
        run(go())
    assert len(received) == 3 and streamed_text(received, "chat") == "You said:"
    with pytest.raises(BackendUnavailable):  # a whole answer cut midway
        run(backend.complete("chat", body(kind, "chat")))


def test_openai_backend_forwards_unknown_fields_and_metadata(mock):
    backend = make_backend(deployment("openai", mock.api_base, first_token_timeout_s=0.3, timeout_s=0.5))

    async def go():
        # The mock reads its fault mode from metadata, so a per-request mode proves metadata reached it.
        timeout = await raised(backend.complete("chat", body("openai", "chat", metadata={"mock_mode": "hang"}, top_k=5)))
        answer = await backend.complete("chat", body("openai", "chat", top_k=5, n=2))
        return timeout, answer, await backend.health()

    timeout, answer, healthy = run(go())
    assert isinstance(timeout, BackendTimeout)
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert healthy is True


def test_api_key_comes_from_the_named_variable(mock, monkeypatch):
    monkeypatch.delenv("MOCK_KEY_FOR_TEST", raising=False)
    for kind in REMOTE_KINDS:
        backend = make_backend(deployment(kind, mock.api_base, api_key_env="MOCK_KEY_FOR_TEST"))
        with pytest.raises(BackendError, match="MOCK_KEY_FOR_TEST") as info:
            run(backend.complete("chat", body(kind, "chat")))
        assert info.value.code == "missing_api_key"
    monkeypatch.setenv("MOCK_KEY_FOR_TEST", "sk-test-value")
    assert text_of(run(make_backend(deployment("litellm", mock.api_base, api_key_env="MOCK_KEY_FOR_TEST"))
                       .complete("chat", body("litellm", "chat"))), "chat").startswith("You said:")


def test_registry_and_factory():
    assert backend_class("openai").__name__ == "OpenAICompatBackend"
    with pytest.raises(ValueError, match="unknown backend kind 'vllm'"):
        backend_class("vllm")
    local = ModelDeployment(name="smollm2-135m-instruct", kind="local", local="smollm2-135m-instruct")
    with pytest.raises(ValueError, match="needs engine_pool"):
        make_backend(local)


@pytest.fixture
def no_stored_winners(tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_COMPILE_DB", str(tmp_path / "winners.sqlite"))


@pytest.mark.slow
def test_local_backend_matches_the_engine_server_whole_and_streamed(no_stored_winners):
    """The one test that loads a real model: SmolLM2 through the pool, seeded sampling, compared with
    `link engine serve`'s app on the same loaded model."""
    import httpx

    from link.backends.local import EnginePool
    from serving.api.server import create_engine_app
    from serving.engine.llm_engine import EngineConfig

    dep = ModelDeployment(name="smollm2-135m-instruct", kind="local", local="smollm2-135m-instruct", context_length=2048,
                          engine={"max_num_seqs": 3, "kv_cache_mb": 64})
    request = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}],
               "temperature": 0.7, "seed": 11, "max_tokens": 12}

    async def go():
        pool = EnginePool(auto_tune=False)
        backend = make_backend(dep, engine_pool=pool)
        assert await backend.health()  # not loaded yet, but nothing failed
        whole = await backend.complete("chat", request)
        chunks = await collect(backend, "chat", {**request, "stream": True, "stream_options": {"include_usage": True}})
        completion = await backend.complete("completion", {"model": dep.name, "prompt": "The capital of France is",
                                                           "temperature": 0, "max_tokens": 4})
        errors = []
        for bad in ({**request, "max_tokens": 5000}, {**request, "top_logprobs": 2}):
            with pytest.raises(BackendError) as info:
                await backend.complete("chat", bad)
            errors.append(info.value)
        healthy = await backend.health()
        assert pool.spec_for(dep).context_length == 2048
        config = (await pool.get(dep)).engine.engine.config  # the deployment's engine options were applied
        assert (config.max_num_seqs, config.kv_cache_bytes, config.block_size) == (3, 64 * 2**20, 16)
        app = create_engine_app(dep.name, loaded=(await pool.get(dep)).loaded,
                                engine_config=EngineConfig(auto_tune=False))
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://engine") as client:
            served = (await client.post("/v1/chat/completions", json=request)).json()
        await pool.aclose()
        return whole, chunks, completion, errors, healthy, served

    whole, chunks, completion, errors, healthy, served = run(go())
    text = whole["choices"][0]["message"]["content"]
    assert whole["object"] == "chat.completion" and whole["model"] == "smollm2-135m-instruct" and text
    assert streamed_text(chunks, "chat") == text
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] <= 12
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] == 4
    too_long, bad_logprobs = errors
    assert too_long.status_code == 400 and too_long.code == "context_length_exceeded" and not too_long.retryable
    assert bad_logprobs.status_code == 400 and bad_logprobs.to_openai()["error"]["param"] == "top_logprobs"
    assert healthy
    assert "choices" in served, served  # the standalone engine server gives the same seeded answer
    assert served["choices"] == whole["choices"] and served["usage"] == whole["usage"]


@pytest.mark.slow
def test_a_deployments_engine_dtype_overrides_the_pools(no_stored_winners):
    """`engine: {dtype: ...}` loads that deployment in its own dtype (the pool's, LINK_LOCAL_DTYPE, for the rest).
    Float weights: packed GGUF blocks always compute in float32."""
    import torch

    from link.backends.local import EnginePool

    own = ModelDeployment(name="smol-bf16", kind="local", local="smollm2-135m-instruct", context_length=2048,
                          engine={"kv_cache_mb": 32, "dtype": "bfloat16", "weights": "float"})

    async def go():
        pool = EnginePool(dtype="float32", auto_tune=False)
        state = await pool.get(own)
        dtype, cache_dtype = state.loaded.dtype, state.loaded.model.embed_tokens.weight.dtype
        await pool.aclose()
        return dtype, cache_dtype

    assert run(go()) == (torch.bfloat16, torch.bfloat16)
    assert own.engine.engine_config().kv_cache_bytes == 32 * 2**20  # dtype is the loader's, not an EngineConfig field
