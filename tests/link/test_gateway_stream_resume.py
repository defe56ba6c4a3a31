"""Streams that survive a dying backend: a policy's `continue_on_failure: true` (link/stream_resume.py).

A fake OpenAI-compatible backend streams 20 tokens of a fixed answer and drops the connection; the policy's next
candidate continues the same answer. With the option the client reads one stream (one id, created and model)
whose text is the streamed prefix followed by the next backend's continuation, that backend received the prefix
as a trailing assistant message to continue (or appended to a completion's prompt), and usage, `link_billed`, the
cost and the request-log row count both calls. Without it the stream ends with the clean error event, as before.
test_gateway_stream_resume_local.py puts the real local engine (SmolLM2, Qwen2.5-Coder 0.5B) second.
"""

from __future__ import annotations

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread
from tests.link.sse import sse_events

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
ANSWER = ("The capital of France is Paris. It is known for the Eiffel Tower, the Louvre museum and the cafes that "
          "line the river Seine in the summer")
PREFIX = " ".join(ANSWER.split()[:20])  # what the dying backend streams: a role chunk, then one word per chunk
CONTINUATION = "and so the answer ends here"
USER = [{"role": "user", "content": "tell me"}]


def dying_backend():
    """A backend that streams the role chunk and 20 words of ANSWER, then drops the connection."""
    return start_mock_thread("die", die_after=21, reply=ANSWER)


@pytest.fixture(scope="module")
def backends():
    dying, following = dying_backend(), start_mock_thread("ok", reply=CONTINUATION)
    yield {"dying": dying, "next": following}
    for server in (dying, following):
        server.stop()


@pytest.fixture(scope="module")
def gateway(backends, new_database_url, tmp_path_factory):
    from link.config import parse_config

    models = [mock_deployment("dying", backends["dying"].api_base), mock_deployment("next", backends["next"].api_base)]
    policies = [{"name": "survive", "type": "fallback", "models": ["dying", "next"], "options": {"continue_on_failure": True}},
                {"name": "plain", "type": "fallback", "models": ["dying", "next"]}]
    # the dead replica is ejected at once and readmitted by the next health probe, for the next test
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"), eject_cooldown_s=0.0,
                                health_interval_s=0.1)
    with start_gateway_thread(settings, parse_config({"models": models, "policies": policies})) as server:
        yield server


def stream(gateway, path: str, body: dict, timeout_s: float = 30) -> tuple[httpx.Response, list]:
    with httpx.stream("POST", gateway.base_url + path, json={**body, "stream": True}, headers=AUTH, timeout=timeout_s) as r:
        return r, sse_events(r.read().decode())


def wait_in_rotation(gateway, model: str) -> None:
    import time

    deadline = time.monotonic() + 5
    while not gateway.state.pools[model].healthy_replicas and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_next_candidate_continues_the_answer(gateway, backends):
    wait_in_rotation(gateway, "dying")
    response, events = stream(gateway, "/chat/completions", {"model": "survive", "messages": USER, "max_tokens": 40,
                                                             "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["x-link-model"] == "dying"
    assert not any("error" in e for e in events)
    *chunks, usage_chunk = events
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == PREFIX + CONTINUATION  # the second backend's words start without a space: one token per word
    assert {(c["id"], c["created"], c["model"]) for c in events} == {(chunks[0]["id"], chunks[0]["created"], "dying")}
    assert sum("role" in c["choices"][0]["delta"] for c in chunks) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("stop") == 1 and chunks[-1]["choices"][0]["finish_reason"] == "stop"

    sent = backends["next"].last_body()  # the partial answer, as an assistant message to continue
    assert sent["messages"] == [*USER, {"role": "assistant", "content": PREFIX}]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 20 and sent["model"] == "mock-model"

    # Call 1 (died, estimated): prompt ceil(len('["tell me"]' + '""' + '[]') / 2) + 8 per message + 128 = 8 + 8 + 128
    # = 144, 20 content chunks; call 2 (the mock's count): 2 + 20 words of prompt, 6 completion words.
    # Prices 1000 / 2000 USD per million tokens.
    cost = (144 * 1000 + 20 * 2000 + 22 * 1000 + 6 * 2000) / 1e6
    assert usage_chunk["choices"] == [] and usage_chunk["id"] == chunks[0]["id"] and usage_chunk["model"] == "dying"
    usage = usage_chunk["usage"]
    assert usage["prompt_tokens"] == 166 and usage["completion_tokens"] == 26 and usage["total_tokens"] == 192
    billed = usage["link_billed"]
    assert billed["calls"] == 2 and billed["prompt_tokens"] == 166 and billed["completion_tokens"] == 26
    assert billed["cost_usd"] == pytest.approx(cost)

    row = logged_request(gateway, response.headers["x-link-request-id"])
    assert row["status"] == "ok" and row["model"] == "next" and row["policy"] == "survive"
    assert row["prompt_tokens"] == 166 and row["completion_tokens"] == 26 and row["cost_usd"] == pytest.approx(cost)
    calls = row["decision"]["calls"]
    assert [(c["model"], c["prompt_tokens"], c["completion_tokens"]) for c in calls] == [("dying", 144, 20), ("next", 22, 6)]
    assert calls[0]["usage"] == "estimated" and "usage" not in calls[1]
    attempt = row["decision"]["attempts"][0]
    assert attempt["model"] == "dying" and attempt["after_first_byte"] is True and attempt["code"] == "backend_unavailable"
    assert row["decision"]["continued"] == [{"model": "next", "after_chars": len(PREFIX)}]


def test_a_completion_continues_from_its_prompt_and_the_prefix(gateway, backends):
    wait_in_rotation(gateway, "dying")
    response, events = stream(gateway, "/completions", {"model": "survive", "prompt": "Once upon", "max_tokens": 30,
                                                        "echo": True})
    assert response.status_code == 200 and not any("error" in e for e in events)
    prefix = " ".join(ANSWER.split()[:21])  # a completion stream has no role chunk: 21 words before the drop
    assert "".join(e["choices"][0]["text"] for e in events) == prefix + CONTINUATION
    assert {e["id"] for e in events} == {events[0]["id"]} and {e["model"] for e in events} == {"dying"}
    sent = backends["next"].last_body()
    assert sent["prompt"] == "Once upon" + prefix and sent["max_tokens"] == 9 and sent["echo"] is False
    assert "continue_final_message" not in sent


def test_without_the_option_the_stream_ends_with_the_error_event(gateway, backends):
    wait_in_rotation(gateway, "dying")
    before = backends["next"].stats()["requests"]
    response, events = stream(gateway, "/chat/completions", {"model": "plain", "messages": USER})
    assert response.status_code == 200 and response.headers["x-link-model"] == "dying"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == PREFIX and events[-1]["error"]["code"] == "backend_unavailable"
    assert backends["next"].stats()["requests"] == before  # nobody was asked to continue
    row = logged_request(gateway, response.headers["x-link-request-id"])
    assert row["status"] == "error" and row["model"] == "dying" and "after the first byte" in row["error"]
    assert "calls" not in row["decision"] and row["decision"]["usage"] == "estimated"


def test_an_answer_with_several_choices_is_not_continued(gateway, backends):
    wait_in_rotation(gateway, "dying")
    before = backends["next"].stats()["requests"]
    _, events = stream(gateway, "/chat/completions", {"model": "survive", "messages": USER, "n": 2})
    assert events[-1]["error"]["code"] == "backend_unavailable"
    assert backends["next"].stats()["requests"] == before


def test_the_option_is_checked_strictly():
    from link.config import PolicyConfig
    from link.policies import make_policy
    from link.policies.options import PolicyError

    models = ("a", "b")
    fallback = make_policy(PolicyConfig(name="f", type="fallback", models=["a", "b"], options={"continue_on_failure": True}), models)
    assert fallback.continue_on_failure is True
    assert make_policy(PolicyConfig(name="g", type="fallback", models=["a", "b"]), models).continue_on_failure is False
    with pytest.raises(PolicyError) as bad:
        make_policy(PolicyConfig(name="f", type="fallback", models=["a", "b"], options={"continue_on_failure": "yes"}), models)
    assert bad.value.param == "options.continue_on_failure" and "true or false" in bad.value.message
    with pytest.raises(PolicyError) as moa:
        make_policy(PolicyConfig(name="m", type="moa", models=["a", "b"], options={"continue_on_failure": True}), models)
    assert moa.value.param == "options.continue_on_failure" and "several calls" in moa.value.message
