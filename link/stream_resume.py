"""Continuing a stream whose backend died after its first byte (a policy's `continue_on_failure: true`).

    transcript = Transcript("chat", body)
    transcript.take(chunk)                                   # every chunk the client was sent
    sent = continuation_body("chat", body, transcript, deployment.kind)   # the next candidate's request
    chunk = transcript.continued(chunk)                      # its chunks as parts of the same answer

The relay that uses them is `proxy.sse_frames` (link/proxy.py). The next candidate is asked to go on from what
the client already has: a chat request gets the original messages plus the partial answer as a trailing assistant
message, which vLLM, SGLang and our engine continue rather than close when told `continue_final_message: true,
add_generation_prompt: false` (sent to `local` and `openai` deployments; a `litellm` provider gets the trailing
assistant message alone, which Anthropic's and others' APIs read as a prefill to continue); a completion request
gets the partial text appended to its prompt. Its token budget (`max_tokens` / `max_completion_tokens`, 16 by
default for completions as OpenAI's) is what the first calls left, counting each content chunk as one token
(the estimate the accounting charges a call that died). The client's chunks keep the first call's `id`,
`created` and `model`.

A stream is not continued (the clean error event stays) when it cannot be: several choices (`n` > 1), tool calls
or a refusal already streamed, a `finish_reason` already sent (the answer was complete; only its usage was lost),
a JSON `response_format` (a constrained answer cannot be resumed from text), a completion prompt of token ids or
several prompts, or content parts in a client's own trailing assistant message.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from link.accounting import RequestRecord

# The deployment kinds that take vLLM's `continue_final_message` (our engine, vLLM / SGLang / `link engine serve`).
CONTINUATION_FIELD_KINDS = ("local", "openai")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default of /v1/completions
_IDENTITY = ("id", "created", "model", "system_fingerprint")


def can_continue(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether a request's answer can be continued from text at all (see the module docstring)."""
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return False
    if (body.get("response_format") or {}).get("type", "text") != "text":
        return False
    if endpoint == "completion":
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))
    messages = body.get("messages") or []
    if body.get("continue_final_message") and messages and not isinstance(messages[-1].get("content"), str):
        return False
    return True


@dataclass
class Transcript:
    """The answer the client has received so far, over every call that wrote it.

    Attributes:
        text: the answer's text (choice 0's content or text).
        num_tokens: its content chunks, each counted as one token (the charge of a call that reported no usage).
        is_resumable: False once the answer cannot be continued (see `can_continue`; tool calls, a refusal,
            a second choice or a finish_reason seen).
        identity: the first chunk's `id`, `created`, `model` (and `system_fingerprint`), kept on every chunk.
    """

    endpoint: str
    body: dict[str, Any]
    text: str = ""
    num_tokens: int = 0
    is_resumable: bool = True
    identity: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.is_resumable = can_continue(self.endpoint, self.body)

    def take(self, chunk: dict) -> None:
        """Note one chunk the client was sent (its `model` already the public name)."""
        if not self.identity:
            self.identity = {k: chunk[k] for k in _IDENTITY if k in chunk}
        has_content = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if choice.get("index", 0) != 0 or delta.get("tool_calls") or delta.get("function_call") or delta.get("refusal"):
                self.is_resumable = False
            piece = choice.get("text") if self.endpoint == "completion" else delta.get("content")
            if piece:
                self.text += piece
                has_content = True
            if choice.get("finish_reason"):
                self.is_resumable = False
        self.num_tokens += has_content

    def continued(self, chunk: dict) -> dict | None:
        """A chunk of a continuing call as a chunk of the same answer: the first call's identity, no second
        `role` delta; None for a chunk left with nothing to say. Notes it (`take`)."""
        chunk.update(self.identity)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                delta.pop("role")
                if delta.get("content") == "" and len(delta) == 1:
                    delta.pop("content")
        choices = chunk.get("choices") or []
        if choices and all(not c.get("delta") and not c.get("text") and not c.get("finish_reason") and not c.get("logprobs")
                           for c in choices):
            return None
        self.take(chunk)
        return chunk

    def tokens_left(self) -> int | None:
        """The completion tokens the request still allows (None: no limit set on a chat request)."""
        limit = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        if limit is None and self.endpoint == "completion":
            limit = COMPLETION_DEFAULT_MAX_TOKENS
        return None if limit is None else limit - self.num_tokens


def continuation_body(endpoint: str, body: dict[str, Any], transcript: Transcript, kind: str) -> dict[str, Any]:
    """The request that asks the next candidate (a deployment of `kind`) to go on from `transcript.text`; the
    caller has checked `transcript.tokens_left()` is at least 1."""
    sent = copy.deepcopy(body)
    left = transcript.tokens_left()
    for key in ("max_completion_tokens", "max_tokens"):
        if sent.get(key) is not None:
            sent[key] = left
    if endpoint == "completion":
        if sent.get("max_tokens") is None:
            sent["max_tokens"] = left
        sent["echo"] = False  # the client has the prompt already
        prompt = sent["prompt"]
        sent["prompt"] = prompt + transcript.text if isinstance(prompt, str) else [prompt[0] + transcript.text]
        return sent
    if sent.get("min_tokens"):
        sent["min_tokens"] = max(0, sent["min_tokens"] - transcript.num_tokens)
    messages = sent["messages"]
    if body.get("continue_final_message"):  # the client's own prefill: the partial answer extends it
        messages[-1]["content"] += transcript.text
    else:
        messages.append({"role": "assistant", "content": transcript.text})
    if kind in CONTINUATION_FIELD_KINDS:
        sent["continue_final_message"], sent["add_generation_prompt"] = True, False
    return sent


def length_end(transcript: Transcript) -> dict:
    """The closing chunk of an answer whose token budget the dead calls used up (finish_reason "length")."""
    if transcript.endpoint == "completion":
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
        return {**transcript.identity, "object": "text_completion", "choices": [choice]}
    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    return {**transcript.identity, "object": "chat.completion.chunk", "choices": [choice]}


def resumed_usage(record: RequestRecord) -> dict[str, Any]:
    """The client's `usage` of a continued answer: the tokens of every call (the dead ones' estimated), and in
    `link_billed` the same with their cost (USD) and number of calls, as an executed plan's (link/executor.py)."""
    counts = {"prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
              "total_tokens": record.prompt_tokens + record.completion_tokens}
    return {**counts, "link_billed": {**counts, "cost_usd": record.calls_cost_usd,
                                      "calls": len(record.decision.get("calls", []))}}
