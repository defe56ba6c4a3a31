"""The engine server's OpenAI contract beyond the happy path, on loopback with the real SmolLM2: a
non-streamed client that leaves, framework errors as OpenAI error objects, strict types, logit_bias,
min_tokens, best_of, and logprobs of tokens that hold part of a UTF-8 character."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from serving.sampling.params import SamplingParams
from serving.text.detokenizer import TokenBytes

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
EMOJI = [{"role": "user", "content": "Reply with five party emojis like 🎉🥳🎂."}]


def _is_error_object(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_non_streamed_client_that_leaves_aborts_its_request(server):
    base, app = server
    engine = app.state.engine_state.engine
    total = engine.engine.block_manager.num_blocks
    seen_running, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen_running.append(engine.num_running)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(base + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=3))
    left = time.monotonic()
    stop.set()
    watcher.join()
    assert max(seen_running) == 1, "the request never ran"
    while engine.num_running or engine.engine.has_unfinished_requests or engine.engine.block_manager.num_free_blocks != total:
        # 4,000 tokens take minutes here; the abort lands before the next engine step.
        assert time.monotonic() - left < 10, "the abandoned request kept generating"
        time.sleep(0.02)


def test_framework_errors_are_openai_error_objects(server, client):
    base = server[0]
    bad_utf8 = httpx.post(base + "/v1/chat/completions", content=b'{"model": "\xff\xfe"}', headers={"content-type": "application/json"})
    assert _is_error_object(bad_utf8, 400)["type"] == "invalid_request_error"
    not_json = httpx.post(base + "/v1/completions", content=b"hello", headers={"content-type": "text/plain"})
    _is_error_object(not_json, 400)
    wrong_method = _is_error_object(httpx.get(base + "/v1/chat/completions"), 405)
    assert "GET" in wrong_method["message"]
    unknown = _is_error_object(httpx.get(base + "/v1/engines"), 404)
    assert unknown["type"] == "invalid_request_error" and unknown["message"] == "Invalid URL (GET /v1/engines)"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-17")
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("field,value", [
    ("n", "2"), ("max_tokens", 5.0), ("stream", "true"), ("temperature", "0.5"), ("seed", 1.5),
    ("logprobs", "true"), ("min_tokens", -1), ("logit_bias", {"abc": 1}), ("logit_bias", {"5": 101}),
])
def test_wrong_types_are_400s_naming_the_field(server, field, value):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, field: value}
    error = _is_error_object(httpx.post(server[0] + "/v1/chat/completions", json=body), 400)
    assert error["param"] == field and error["message"].startswith(field), error


def test_unsupported_fields_are_clear_400s(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hi", best_of=3, max_tokens=2)
    assert info.value.body["param"] == "best_of" and "not supported" in info.value.body["message"]
    assert "engine server" not in info.value.body["message"]  # the gateway sends the same message
    # tools are served (serving/tools/harness.py, tests/serving/tools/test_harness.py); a malformed tool is a 400 naming it
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[{"type": "function", "function": {}}])
    assert info.value.body["param"] == "tools[0].function.name" and "tools[0].function.name" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logit_bias={"49152": 5})
    assert info.value.body["param"] == "logit_bias"


def test_unknown_fields_and_messages_without_content_are_400s_naming_them(server):
    url = server[0] + "/v1/chat/completions"
    unknown = _is_error_object(httpx.post(url, json={"model": MODEL, "messages": QUESTION, "foo": 1}), 400)
    assert unknown["message"] == "Unrecognized request argument supplied: foo" and unknown["param"] == "foo"
    no_content = _is_error_object(httpx.post(url, json={"model": MODEL, "messages": [{"role": "user"}]}), 400)
    assert no_content["param"] == "messages[0].content" and "messages[0].content" in no_content["message"]
    stop = _is_error_object(httpx.post(url, json={"model": MODEL, "messages": QUESTION, "stop": 5}), 400)
    assert stop["param"] == "stop" and not stop["message"].startswith("stop.str")
    options = _is_error_object(httpx.post(url, json={"model": MODEL, "messages": QUESTION, "stream_options": {}}), 400)
    assert options["param"] == "stream_options" and "only allowed when 'stream' is enabled" in options["message"]


@pytest.mark.parametrize("fields,param", [
    ({"modalities": ["text", "audio"]}, "modalities"), ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"), ({"function_call": "auto"}, "function_call"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
     "messages[0].content[1]"),
])
def test_fields_a_local_model_cannot_honour_are_clear_400s(server, fields, param):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, **fields}
    assert _is_error_object(httpx.post(server[0] + "/v1/chat/completions", json=body), 400)["param"] == param


def test_harmless_fields_are_accepted_and_stop_goes_with_response_format(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    call_tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    history = [*QUESTION, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "Paris"}]
    out = client.chat.completions.create(model=MODEL, messages=history, max_tokens=2, user="u", store=False, metadata={"a": "b"},
                                         service_tier="auto", reasoning_effort="low", modalities=["text"],
                                         prediction={"type": "content", "content": "Paris"}, tools=[call_tool], tool_choice="none",
                                         parallel_tool_calls=True)
    assert out.choices[0].finish_reason in ("stop", "length")
    json_out = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, stop=["}"],
                                              response_format={"type": "json_object"})  # OpenAI accepts both
    assert json_out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("path,fields,param", [
    ("/v1/completions", {"prompt": [1] * 6000}, "prompt"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 100_000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 6000}]}, "messages"),
    ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 100_000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": QUESTION, "max_completion_tokens": 100_000}, "max_completion_tokens"),
])
def test_context_length_errors_name_the_field_at_fault(server, path, fields, param):
    # This server's KV cache (256 MiB) caps SmolLM2's context at 5,824 tokens.
    error = _is_error_object(httpx.post(server[0] + path, json={"model": MODEL, **fields}), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == param, error


def test_logit_bias_and_min_tokens_change_the_output(client, smollm2):
    tokenizer = smollm2.tokenizer
    forced = tokenizer.encode(" banana", add_special_tokens=False)[0]
    out = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=3,
                                    logit_bias={str(forced): 100})
    assert out.choices[0].text == tokenizer.decode([forced] * 3)
    base = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=64)
    assert base.choices[0].finish_reason == "stop"
    wanted = base.usage.completion_tokens + 4  # EOS masked until then: the answer runs on to max_tokens
    longer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=wanted,
                                            extra_body={"min_tokens": wanted})
    assert (longer.usage.completion_tokens, longer.choices[0].finish_reason) == (wanted, "length")


def test_chat_logprobs_carry_the_raw_bytes_of_partial_characters(client, smollm2):
    out = client.chat.completions.create(model=MODEL, messages=EMOJI, temperature=0, max_tokens=24, logprobs=True, top_logprobs=1)
    choice = out.choices[0]
    ids = smollm2.chat(EMOJI, SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].token_ids
    eos = set(smollm2.tokenizer.eos_token_ids)
    content = [t for t, tid in zip(choice.logprobs.content, ids, strict=True) if tid not in eos]
    partial = [t for t in content if _is_partial(bytes(t.bytes))]
    assert partial, "no token held part of a character"
    assert all("\ufffd" not in t.token and "\\x" in t.token for t in partial)
    # The bytes of the tokens, joined, are the message: nothing was replaced by U+FFFD on the way.
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", errors="replace") == choice.message.content
    assert all(t.top_logprobs[0].bytes == t.bytes for t in content)  # greedy: the top token is the chosen one


def _is_partial(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_completion_text_offsets_are_character_offsets(client, smollm2):
    prompt = "Party emojis: 🎉🥳🎂🎉🥳"
    kwargs = dict(model=MODEL, prompt=prompt, temperature=0, max_tokens=12, logprobs=1)
    whole = client.completions.create(**kwargs).choices[0]
    ids = smollm2.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids
    raws = [TokenBytes(smollm2.tokenizer)(t) for t in ids]
    assert any(_is_partial(r) for r in raws), "no token held part of a character"
    # Independently: token i starts at the number of whole characters in the bytes of tokens [0, i).
    expected = [len(b"".join(raws[:i]).decode("utf-8", errors="ignore")) for i in range(len(ids))]
    assert whole.logprobs.text_offset == expected
    streamed = [o for c in client.completions.create(**kwargs, stream=True) if c.choices and c.choices[0].logprobs
                for o in c.choices[0].logprobs.text_offset]
    assert streamed == expected
