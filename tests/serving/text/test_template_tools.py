"""A chat template that renders `tools` itself gets the OpenAI tools and "tool" messages; one that does not
gets the harness's own tools text (the request path `serving.frontend.responses.plan_chat`)."""

from __future__ import annotations

import json

from protocol.openai import ChatCompletionRequest
from serving.frontend.chat_tools import prepare_chat
from serving.text.chat_format import TemplateChatFormat

# A cut-down Qwen2.5-style template: tools as one `tojson` line each, results wrapped in <tool_response>.
TOOLS_TEMPLATE = (
    "{% if tools %}T:{% for t in tools %}{{ t | tojson }};{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}R[{{ m.content }}]{% else %}{{ m.role }}:{{ m.content }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}assistant:"
TOOL = {"type": "function", "function": {"name": "w", "description": "Météo <now>", "parameters": {"type": "object"}}}


def test_a_template_reading_tools_renders_them_as_json_in_key_order():
    fmt = TemplateChatFormat(TOOLS_TEMPLATE)
    assert fmt.renders_tools and not TemplateChatFormat(PLAIN_TEMPLATE).renders_tools
    text = fmt.render([{"role": "user", "content": "hi"}], tools=[TOOL])
    # json.dumps as Hugging Face's template filter writes it: keys in order, "é" and "<" unescaped.
    assert text == f"T:{json.dumps(TOOL, ensure_ascii=False)};\nuser:hi\nassistant:"
    assert '"type": "function", "function"' in text and "Météo <now>" in text
    assert fmt.render([{"role": "user", "content": "hi"}]) == "user:hi\nassistant:"  # no tools: no section


def _request(**fields) -> ChatCompletionRequest:
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "5 C"}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": [TOOL], **fields})


def test_native_setup_keeps_tool_messages_and_passes_the_tools():
    setup = prepare_chat(_request(), native=True)
    assert setup.template_tools == [TOOL]
    assert [m["role"] for m in setup.messages] == ["user", "assistant", "tool"]  # no harness system turn
    assert setup.messages[1]["content"] == '<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert setup.messages[2] == {"role": "tool", "content": "5 C"}
    prompt = TemplateChatFormat(TOOLS_TEMPLATE).render(setup.messages, tools=setup.template_tools)
    assert prompt.endswith("R[5 C]assistant:") and prompt.startswith("T:{")
    assert prepare_chat(_request(tool_choice="none"), native=True).template_tools is None


def test_the_harness_setup_is_unchanged_without_native():
    setup = prepare_chat(_request())
    assert setup.template_tools is None
    assert setup.messages[0]["role"] == "system" and "<tools>" in setup.messages[0]["content"]
    assert setup.messages[-1]["role"] == "user" and setup.messages[-1]["content"].startswith("<tool_response")
