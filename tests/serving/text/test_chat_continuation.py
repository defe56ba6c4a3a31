"""Continuing a final assistant message (vLLM's `continue_final_message`, `add_generation_prompt: false`).

The expected prompts are written out by hand: a ChatML template's continuation is its usual prompt (a new assistant
turn) followed by the partial reply, with no closing `<|im_end|>`; the in-context transcript ends "Assistant: "
and the partial reply, whose continuation keeps its own opening space.
"""

from __future__ import annotations

import pytest

from serving.errors import ServingError
from serving.sampling.params import SamplingParams
from serving.text.chat_format import InContextChatFormat, TemplateChatFormat

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
USER = [{"role": "user", "content": "Name a colour."}]


def test_a_template_continues_the_final_assistant_message():
    fmt = TemplateChatFormat(CHATML)
    partial = [*USER, {"role": "assistant", "content": "The sky is bl"}]
    expected = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe sky is bl"
    assert fmt.render(partial, add_generation_prompt=False, continue_final_message=True) == expected
    assert fmt.render(USER) + "The sky is bl" == expected
    # without continuing, the assistant turn is closed and nothing new is opened
    assert fmt.render(partial, add_generation_prompt=False).endswith("The sky is bl<|im_end|>\n")
    # a trailing space the template kept stays; an empty partial reply is a new reply
    assert fmt.render([*USER, {"role": "assistant", "content": "Blue, "}], add_generation_prompt=False,
                      continue_final_message=True).endswith("assistant\nBlue, ")
    assert fmt.render([*USER, {"role": "assistant", "content": ""}], add_generation_prompt=False,
                      continue_final_message=True) == fmt.render(USER)


def test_the_in_context_transcript_continues_and_keeps_the_opening_space():
    fmt = InContextChatFormat()
    prompt = fmt.render([*USER, {"role": "assistant", "content": "Blue"}], add_generation_prompt=False,
                        continue_final_message=True)
    assert prompt.endswith("User: Name a colour.\nAssistant: Blue")
    params = SamplingParams(max_tokens=4)
    assert fmt.reply_params(params).strip_leading_space is True
    assert fmt.reply_params(params, continuing=True).strip_leading_space is False


@pytest.mark.parametrize("fmt", [TemplateChatFormat(CHATML), InContextChatFormat()], ids=["template", "in-context"])
def test_continuing_needs_a_final_assistant_message_and_no_generation_prompt(fmt):
    with pytest.raises(ServingError, match="cannot both be true"):
        fmt.render([*USER, {"role": "assistant", "content": "Bl"}], continue_final_message=True)
    with pytest.raises(ServingError, match="last message to be the assistant's"):
        fmt.render(USER, add_generation_prompt=False, continue_final_message=True)


def test_the_request_schema_checks_the_combination():
    from pydantic import ValidationError

    from protocol.openai import ChatCompletionRequest

    ok = ChatCompletionRequest(model="m", messages=[*USER, {"role": "assistant", "content": "Bl"}],
                               continue_final_message=True, add_generation_prompt=False)
    assert ok.continue_final_message and not ok.add_generation_prompt
    with pytest.raises(ValidationError, match="cannot both be true"):
        ChatCompletionRequest(model="m", messages=[*USER, {"role": "assistant", "content": "Bl"}], continue_final_message=True)
    with pytest.raises(ValidationError, match="assistant's"):
        ChatCompletionRequest(model="m", messages=USER, continue_final_message=True, add_generation_prompt=False)
