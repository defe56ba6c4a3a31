"""The gateway with its embedded default (what `make serve` runs): the real local models answer the
official `openai` client, streamed and whole (smollm2-135m-instruct), and a short completion
(qwen2.5-coder-0.5b-instruct); a request with tools never fails (the harness parser turns the output into tool_calls
or plain content).

The engines read kernel winners from a table of this module's own (LINK_COMPILE_DB, empty) and tune nothing in the
background (`local_auto_tune` off): a test pays neither for torch.compile warm-ups of winners other tests stored in
the shared $LINK_HOME nor for tuning that competes with the next model's load.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.link.gateway_launch import gateway_settings, start_gateway_thread

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(new_database_url, tmp_path_factory):
    from link.config import load_config

    home = tmp_path_factory.mktemp("home")
    # Development open mode (no master key, no keys): any key is let in, as with `make serve` out of the box.
    settings = gateway_settings(new_database_url("sqlite"), home, master_key=None, local_auto_tune=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LINK_COMPILE_DB", str(home / "winners.sqlite"))  # no stored winners, none written
        with start_gateway_thread(settings, load_config(None)) as gateway:
            yield openai.OpenAI(base_url=gateway.base_url, api_key="anything", max_retries=0, timeout=600)


def test_smollm2_whole_and_streamed_agree(client):
    request = dict(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "What is the capital of France?"}],
                   max_tokens=8, temperature=0)
    raw = client.chat.completions.with_raw_response.create(**request)
    whole = raw.parse()
    assert raw.headers["x-link-model"] == "smollm2-135m-instruct" and whole.model == "smollm2-135m-instruct"
    assert whole.choices[0].message.content and whole.usage.completion_tokens <= 8
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_qwen_short_completion(client):
    answer = client.completions.create(model="qwen2.5-coder-0.5b-instruct", prompt="The capital of France is",
                                       max_tokens=4, temperature=0)
    assert answer.model == "qwen2.5-coder-0.5b-instruct" and "Paris" in answer.choices[0].text
    assert answer.usage.completion_tokens <= 4


def test_tools_request_to_smollm2_is_well_formed(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    answer = client.chat.completions.create(model="smollm2-135m-instruct", tools=tools, max_tokens=24, temperature=0,
                                            messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    message = answer.choices[0].message
    for call in message.tool_calls or []:
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
    assert message.tool_calls or message.content is not None
