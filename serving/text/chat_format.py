"""Chat formatting: OpenAI-style messages -> one prompt string.

- `TemplateChatFormat`: the model's own Jinja2 chat template (GGUF `tokenizer.chat_template`, e.g.
  SmolLM2's ChatML), rendered in a sandbox with `add_generation_prompt=True`. A template that reads the
  variable `tools` (Qwen2.5's) `renders_tools`: it gets the OpenAI tools as Hugging Face's
  `apply_chat_template` passes them, and "tool" messages as they are.
- `InContextChatFormat`: for base models with no template (Gemma 3 270M). We prepend a short fixed
  conversation in a plain "User:/Assistant:" transcript so the model continues in the assistant's
  voice, and stop generation when it starts the next turn (its turn markers are stop strings, added
  after the client's own `stop`). A plain transcript was chosen over Gemma's instruction-tuned
  `<start_of_turn>` markup because a base model has seen transcripts of this shape far more often in
  pre-training than the markup of a later fine-tune. The prompt ends with "Assistant:" and no space:
  the reply's first token carries the space ("▁The"), as in the examples; a prompt ending in the space
  leaves a bare "▁" token that the model rarely saw followed by a word, and it then answers far worse
  (lists, runs of digits). The engine drops that one space from the text (`strip_leading_space`).

    params = fmt.reply_params(params)   # the format's stop strings and strip_leading_space

A trailing assistant message can be continued instead of closed (`render(..., continue_final_message=True)`),
the convention of vLLM's `continue_final_message` / `add_generation_prompt: false` and of Hugging Face's
`apply_chat_template(continue_final_message=True)`: the conversation is rendered without a generation prompt
and cut right after the final message's text, so the model's next token extends it (the gateway uses it to
continue a stream whose backend died, link/stream_resume.py). The reply's tokens then carry their own
spacing: a continuation keeps `strip_leading_space` off (`reply_params(params, continuing=True)`).
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

from serving.errors import ServingError
from serving.sampling.params import SamplingParams

ROLES = ("system", "user", "assistant", "tool", "developer")


def message_text(content: Any) -> str:
    """The text of a message's `content`: a string, or OpenAI content parts of type "text"."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ServingError(f"unsupported content part {part!r}: local models accept text parts only")
            texts.append(part.get("text", ""))
        return "".join(texts)
    raise ServingError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def normalize_messages(messages: Sequence[dict]) -> list[dict[str, str]]:
    """Validate OpenAI chat messages and flatten their content to strings.

    Raises:
        ServingError: an empty list, a message without a known role, or non-text content.
    """
    if not messages:
        raise ServingError("messages must contain at least one message")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise ServingError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        out.append({"role": "system" if role == "developer" else role, "content": message_text(m.get("content"))})
    return out


class ChatFormat(ABC):
    """Renders messages into a prompt; `stop` lists extra stop strings that end the assistant turn;
    `strip_leading_space` says the reply opens with a space that is not part of it."""

    stop: tuple[str, ...] = ()
    strip_leading_space: bool = False
    add_special_tokens: bool = True

    renders_tools: bool = False

    @abstractmethod
    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None = None, *,
               add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
        """The prompt text ending where the assistant's reply begins; `tools` (OpenAI tools) only where
        `renders_tools`, else ignored (the harness writes them into the messages instead).

        `continue_final_message`: the last message is an assistant's partial reply, and the prompt ends with its
        text, unclosed (see the module docstring); `add_generation_prompt=False` without it: the conversation
        as it is, with no opening of a new assistant turn.
        Raises:
            ServingError: both options set, or `continue_final_message` with a last message not the assistant's
                (`check_continuation`); invalid messages (`normalize_messages`).
        """

    def reply_params(self, params: SamplingParams, *, continuing: bool = False) -> SamplingParams:
        """`params` for a reply in this format: the client's `stop` strings first, then the format's
        own (those not already there), and the format's `strip_leading_space` (never when `continuing` a final
        assistant message, whose continuation's opening space is part of the text)."""
        stop = tuple(params.stop) + tuple(s for s in self.stop if s not in params.stop)
        strip = self.strip_leading_space and not continuing
        if stop == tuple(params.stop) and params.strip_leading_space == strip:
            return params
        return dataclasses.replace(params, stop=stop, strip_leading_space=strip)


def check_continuation(messages: Sequence[dict], add_generation_prompt: bool, continue_final_message: bool) -> None:
    """vLLM's rules for continuing a final message. Raises ServingError: both options true (a new turn cannot
    also continue the last one), or `continue_final_message` when the last message is not the assistant's."""
    if continue_final_message and add_generation_prompt:
        raise ServingError("continue_final_message and add_generation_prompt cannot both be true: set "
                           "add_generation_prompt to false to continue the final assistant message")
    if continue_final_message and (not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "assistant"):
        raise ServingError("continue_final_message needs the last message to be the assistant's (its partial reply)")


def cut_after_final_message(prompt: str, final_text: str) -> str:
    """`prompt` (a conversation rendered without a generation prompt) cut right after the last occurrence of the
    final message's text, dropping the turn's closing markup (Hugging Face's `continue_final_message` rule: the
    text is searched stripped, and its trailing whitespace is kept only when the template kept it).

    Raises:
        ServingError: the template changed the text so that it cannot be found.
    """
    stripped = final_text.strip()
    at = prompt.rfind(stripped) if stripped else -1
    if at < 0:
        raise ServingError("continue_final_message: the chat template rewrote the final assistant message, so its "
                           "text cannot be continued")
    tail = final_text.lstrip()
    if prompt[at: at + len(tail)] == tail:
        return prompt[: at + len(tail)]
    return prompt[: at + len(stripped)]


@dataclass
class TemplateChatFormat(ChatFormat):
    template: str
    bos_token: str | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        env.filters["tojson"] = _tojson
        self._compiled = env.from_string(self.template)
        # A template that writes the BOS token itself must not get a second one from the tokenizer.
        self.add_special_tokens = not (self.bos_token and "bos_token" in self.template)
        # A template that reads the `tools` variable offers tools its own way (Qwen2.5's `# Tools` section).
        self.renders_tools = "tools" in meta.find_undeclared_variables(env.parse(self.template))

    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None = None, *,
               add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
        check_continuation(messages, add_generation_prompt, continue_final_message)
        extra = {"tools": list(tools)} if tools and self.renders_tools else {}
        normalized = normalize_messages(messages)
        if continue_final_message and not normalized[-1]["content"].strip():  # nothing written yet: a new reply
            normalized, continue_final_message, add_generation_prompt = normalized[:-1], False, True
        prompt = self._compiled.render(
            messages=normalized, add_generation_prompt=add_generation_prompt and not continue_final_message,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra,
        )
        return cut_after_final_message(prompt, normalized[-1]["content"]) if continue_final_message else prompt


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    """Templates' `tojson` as chat templates expect it: plain `json.dumps` (keys in order, non-ASCII kept),
    not Jinja's HTML-safe default that sorts keys and escapes `<`, `>`, `&` and `'`."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_template_error(message: str):
    raise ServingError(f"chat template rejected the messages: {message}")


IN_CONTEXT_PREAMBLE = (
    "The following is a conversation between a user and a helpful, knowledgeable assistant "
    "who answers accurately and concisely.\n\n"
    "User: What is the capital of Italy?\n"
    "Assistant: The capital of Italy is Rome.\n\n"
    "User: How many legs does a spider have?\n"
    "Assistant: A spider has eight legs.\n\n"
)


class InContextChatFormat(ChatFormat):
    """A few-shot transcript for base models: "User: ..." / "Assistant: ..." turns."""

    # The markers that open a turn in this transcript: the model writing one has left its reply.
    stop = ("\nUser:", "\nAssistant:", "\nTool result:", "\n\nUser")
    strip_leading_space = True

    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None = None, *,
               add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
        """The leading system messages, the preamble, then the turns; the prompt ends with "Assistant:" (with
        `continue_final_message`: "Assistant: " and the final message's text; without a generation prompt: the
        last turn).

        The system text comes before the examples: placed after them, right before the user's turn,
        it was the text Gemma 270M went on to repeat after its answer ("The sky is blue.\\n\\nReply
        with one word."), a run-on no turn marker catches.
        """
        check_continuation(messages, add_generation_prompt, continue_final_message)
        messages = normalize_messages(messages)
        final = messages.pop() if continue_final_message else None
        num_leading = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        parts = [f"{m['content']}\n\n" for m in messages[:num_leading]] + [IN_CONTEXT_PREAMBLE]
        for m in messages[num_leading:]:
            if m["role"] == "system":
                parts.append(f"{m['content']}\n\n")
            elif m["role"] == "user":
                parts.append(f"User: {m['content']}\n")
            elif m["role"] == "assistant":
                parts.append(f"Assistant: {m['content']}\n\n")
            else:
                parts.append(f"Tool result: {m['content']}\n")
        if final is not None:
            parts.append(f"Assistant: {final['content']}")
        elif add_generation_prompt:
            parts.append("Assistant:")
        return "".join(parts)
