"""After a tool result, the model's answer must not echo the harness's result block (`<tool_response>...`):
each harness format knows its result markers; blocks the model writes before its answer are skipped (EOS is
refused until it answers), one after answer text stops it, and every block is cut where the calls are parsed. Hand-written model outputs for every harness format (json, xml,
xml-wrapped) under SmolLM2's chat template and Gemma's in-context format, then the real SmolLM2 through the
engine server.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/tools/test_tool_result_echo.py
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from protocol.openai import ChatCompletionRequest
from serving.engine.stop import check_stop
from serving.frontend.chat_tools import ToolStream, tool_message
from serving.frontend.responses import plan_chat
from serving.engine.stop import answer_start, check_stop, refuses_eos
from serving.text.chat_format import InContextChatFormat, TemplateChatFormat
from serving.tools.formats import FORMATS, tool_format_from_config
from serving.tools.harness import parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
RESULT = '{"temperature_c": 18, "sky": "cloudy"}'
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
]
ANSWER = "It is 18 C and cloudy in Paris."
FORMAT_NAMES = ("json", "xml", "xml-wrapped")


def _echo(fmt) -> str:
    """The result block as the harness rendered it into the prompt, which a small model goes on to repeat."""
    return fmt.render_result("get_weather", "call_1", RESULT)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_each_format_knows_its_result_markers(name):
    fmt = FORMATS[name]
    block = _echo(fmt)
    assert (fmt.result_open, fmt.result_close) == ("<tool_response", "</tool_response>")
    assert block.startswith(fmt.result_open) and block.endswith(fmt.result_close)


def test_a_custom_result_template_has_its_own_markers_or_none():
    from serving.tools.harness import strip_tool_results

    fmt = tool_format_from_config({"response_template": "<result of={name}>\n{content}\n</result>"})
    assert (fmt.result_open, fmt.result_close) == ("<result", "</result>")
    assert strip_tool_results("Done.\n<result of=f>\n42\n</result>", fmt) == "Done."
    bare = tool_format_from_config({"response_template": "{content}"})  # nothing marks a result: nothing cut
    assert (bare.result_open, bare.result_close) == ("", "")
    assert strip_tool_results("Done. <tool_response>42</tool_response>", bare) == "Done. <tool_response>42</tool_response>"


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_an_echoed_result_block_is_cut_from_the_answer(name):
    fmt = FORMATS[name]
    text = f"{ANSWER}\n{_echo(fmt)}\n"
    for tools in (TOOLS, []):  # tools offered, or none ([]: parsed for echoed results only)
        message, finish = tool_message(text, "stop", tools, fmt=fmt)
        assert message == {"role": "assistant", "content": ANSWER} and finish == "stop"
    assert parse_tool_calls(f"A\n{_echo(fmt)}\nB", TOOLS, fmt=fmt).content == "A\nB"  # text after the block kept
    assert parse_tool_calls('A <tool_response>{"temperature_c": 1', TOOLS, fmt=fmt).content == "A"  # unclosed: to the end
    call = fmt.render_call("get_weather", {"city": "Rome"}, TOOLS)
    parsed = parse_tool_calls(f"{_echo(fmt)}\n{call}", TOOLS, fmt=fmt)  # a call after an echo is still a call
    assert parsed.content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Rome"})]
    # streamed: nothing of the block is sent, and the pieces add up to the whole answer
    stream = ToolStream(TOOLS, fmt=fmt)
    partial = f"{ANSWER}\n<tool_resp"
    sent = stream.safe_length(partial, 0)
    assert partial[:sent] == ANSWER
    deltas, finish = stream.final_deltas(text, sent, "stop")
    assert partial[:sent] + "".join(d.get("content", "") for d in deltas) == ANSWER and finish == "stop"


class _ByteTokenizer:
    """Stands in for a tokenizer where only the prompt's length matters: one token per UTF-8 byte."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())


@pytest.fixture(scope="module")
def smollm2_text(smollm2_gguf_path):
    """SmolLM2's tokenizer and chat template (ChatML) from its GGUF file, without its weights."""
    from serving.loader.gguf_loader import open_gguf
    from serving.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(smollm2_gguf_path, open_gguf(smollm2_gguf_path).metadata)
    return SimpleNamespace(tokenizer=tokenizer,
                           chat_format=TemplateChatFormat(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token))


def _model(kind: str, request):
    if kind == "smollm2":
        return request.getfixturevalue("smollm2_text")
    return SimpleNamespace(tokenizer=_ByteTokenizer(), chat_format=InContextChatFormat())  # Gemma 3 270M's format


def _generate(params, output: str):
    """Feed `output` to the stop check one character at a time (a token per character); the first stop."""
    for i in range(1, len(output) + 1):
        result = check_stop(params, 0, i, output[:i], i - 1, ())
        if result is not None:
            return result
    return None


@pytest.mark.parametrize("kind", ["smollm2", "in-context"])
@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_after_a_tool_result_an_echo_is_skipped_before_the_answer_and_stops_after_it(kind, name, request):
    lm, fmt = _model(kind, request), FORMATS[name]
    plan = plan_chat(ChatCompletionRequest(model="m", messages=HISTORY, tools=TOOLS, stop=["END"]), lm, 8192, fmt)
    assert plan.params.echo_markers == ("<tool_response", "</tool_response>")
    assert plan.params.stop[0] == "END" and "<tool_response" not in plan.params.stop  # no stop at the answer's start
    assert _echo(fmt) in plan.prompt_texts[0]  # the block the model has just read
    # the echo after answer text stops the output there
    stopped = _generate(plan.params, f"{ANSWER}\n{_echo(fmt)}\nIt is sunny.")
    assert (stopped.finish_reason, stopped.stop_reason, stopped.text) == ("stop", "<tool_response", f"{ANSWER}\n")
    message, finish = tool_message(stopped.text, "stop", plan.tools, plan.parallel_tool_calls, plan.forced_tool_calls,
                                   plan.tool_format)
    assert message == {"role": "assistant", "content": f"{ANSWER}\n"} and finish == "stop"
    # an echo first (SmolLM2 repeats the block it read): no stop, EOS refused until the answer, which is kept
    echoed = f"{_echo(fmt)}\n\n{ANSWER}"
    assert _generate(plan.params, echoed) is None
    assert [refuses_eos(plan.params, text) for text in (_echo(fmt)[:20], _echo(fmt), _echo(fmt) + "\n", echoed)] == [
        True, True, True, False]
    assert tool_message(echoed, "stop", plan.tools, fmt=plan.tool_format)[0] == {"role": "assistant", "content": ANSWER}
    # no echo, or a model repeating the closing marker instead of answering: EOS ends it as usual
    assert not refuses_eos(plan.params, ANSWER) and not refuses_eos(plan.params, "")
    assert not refuses_eos(plan.params, f"{_echo(fmt)}\n</tool_response>")
    assert not refuses_eos(dataclasses.replace(plan.params, ignore_eos=True), _echo(fmt))
    # before any tool result there is nothing to echo
    first = plan_chat(ChatCompletionRequest(model="m", messages=HISTORY[:1], tools=TOOLS), lm, 8192, fmt)
    assert first.params.echo_markers == () and not refuses_eos(first.params, _echo(fmt))
    # tool results in the history but no tools offered: the same rules, parsed for echoes only
    bare = plan_chat(ChatCompletionRequest(model="m", messages=HISTORY), lm, 8192, fmt)
    assert bare.params.echo_markers == ("<tool_response", "</tool_response>") and bare.tools == []


@pytest.mark.parametrize("text, start", [
    ("", 0), ("  Hi", 2), ("<tool_resp", None), ("<tool_response>\n{}", None), ("<tool_response>{}</tool_response>", 33),
    ("<tool_response>1</tool_response>\n<tool_response>2</tool_response>\n Hi", 67),  # two blocks, then the answer
    ("<tool_response>1</tool_response>\n</tool_response>Hi", 49),  # a stray closing marker is echo too
    ("<tool_response>1</tool_response></tool_re", None), ("Hi <tool_response>", 0)])
def test_answer_start_skips_leading_result_blocks(text, start):
    assert answer_start(text, ("<tool_response", "</tool_response>")) == start
    if start is not None and start < len(text):
        assert text[start:].lstrip() == text[start:]  # the answer's first character is not whitespace


def test_a_stray_closing_marker_is_cut_from_the_answer():
    from serving.tools.harness import strip_tool_results

    fmt = FORMATS["json"]
    assert strip_tool_results(f"{_echo(fmt)}\n</tool_response>\n{ANSWER}", fmt) == ANSWER
    assert strip_tool_results("</tool_response>", fmt) == ""


@pytest.mark.slow
def test_real_smollm2_answer_after_a_tool_result_has_no_result_block(server):
    """The engine server with the real SmolLM2, greedy: after this tool result it first repeats the result block
    verbatim (`<tool_response>\n{...}\n</tool_response>`) and would end its turn there; whole and streamed, none
    of the block may reach the client, and the answer it writes after it must (stopping at the block's marker
    left it empty)."""
    import httpx

    body = {"model": "smollm2-135m-instruct", "messages": HISTORY, "tools": TOOLS, "temperature": 0, "max_tokens": 96}
    for extra in ({}, {"stream": True}):
        response = httpx.post(server[0] + "/v1/chat/completions", json={**body, **extra}, timeout=300)
        assert response.status_code == 200, response.text
        if extra:
            events = [json.loads(line[6:]) for line in response.text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        else:
            content = response.json()["choices"][0]["message"]["content"] or ""
        assert "<tool_response" not in content and "</tool_response>" not in content
        # it answers: greedy, it repeats the block, is refused EOS there and writes a sentence after it
        assert content.strip() and content == content.strip(), content
