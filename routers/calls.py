"""How routers call models without knowing the gateway: the `ModelCaller` protocol and helpers on its answers.

    class MyCaller:                                   # the gateway implements it (link/executor.py)
        async def complete(self, model, body): ...    # one whole OpenAI answer (dict)
        def stream(self, model, body): ...            # its chunks (dicts), a usage chunk last
    response = await caller.complete("smollm2-135m-instruct", {"messages": [...], "max_tokens": 64})
    response_text(response)                           # the first choice's text

`routers` sits below `link` (DESIGN.md: routers never import link), so a Mixture-of-Agents or a cascade
gets a caller handed in. A body is an OpenAI request without `model` (the caller sets it): a chat body
has `messages`, a completion body has `prompt`. Callers raise any `Exception` for a failed call (the
gateway raises its BackendError); routers treat every Exception from a call as that call's failure and
never catch `asyncio.CancelledError`.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, runtime_checkable

# Request fields that describe how one client wants its answer delivered, not what the answer is; routers
# drop them from the calls they make on the client's behalf (proposers, cascade steps, judges).
DELIVERY_FIELDS = ("model", "stream", "stream_options", "n", "logprobs", "top_logprobs", "user")


@runtime_checkable
class ModelCaller(Protocol):
    """Calls one model (a public model name of the gateway) with an OpenAI body.

    `complete` returns the whole OpenAI response dict (`choices`, `usage`, `model` = the model that
    answered). `stream` yields OpenAI chunk dicts; the last one may carry `usage` with empty `choices`.
    Both raise an Exception subclass when the call fails (after the caller's own retries, if any).
    """

    async def complete(self, model: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, model: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


def is_chat(body: dict[str, Any]) -> bool:
    """True for a chat body (`messages`), False for a completion body (`prompt`)."""
    return "messages" in body


def response_text(response: dict[str, Any]) -> str:
    """The first choice's text: `message.content` (chat) or `text` (completion); "" when absent (tool calls only)."""
    choices = response.get("choices") or [{}]
    choice = choices[0]
    if "message" in choice:
        return (choice["message"] or {}).get("content") or ""
    return choice.get("text") or ""


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the request a model is asked about: the last user message (chat; content parts joined) or
    the prompt (completion; the first one of a list)."""
    if not is_chat(body):
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt and isinstance(prompt[0], str) else ""
        return prompt if isinstance(prompt, str) else ""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def content_text(content: Any) -> str:
    """A message's `content` as text: a string as is, the text parts of a list joined by newlines, None as ""."""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return content or ""


def without_delivery(body: dict[str, Any]) -> dict[str, Any]:
    """`body` without the fields of `DELIVERY_FIELDS` (a sub-call returns one whole choice to the router)."""
    return {k: v for k, v in body.items() if k not in DELIVERY_FIELDS}


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) of an OpenAI usage object; (0, 0) for None."""
    if not usage:
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def chunks_from_response(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole answer as the chunks of a stream: per choice a role chunk (chat), one content chunk and a
    finish chunk, then a usage chunk with empty `choices` (always; the gateway drops it unless asked).

    Used when an answer that was generated whole (a cascade step that was accepted) must reach a streaming
    client. `tool_calls` are sent whole in one delta, as the OpenAI API does for short calls.
    """
    chat = response.get("object", "chat.completion").startswith("chat") or any("message" in c for c in response.get("choices") or [])
    common = {"id": response.get("id"), "object": "chat.completion.chunk" if chat else "text_completion",
              "created": response.get("created"), "model": response.get("model")}
    chunks: list[dict[str, Any]] = []
    for choice in response.get("choices") or []:
        index = choice.get("index", 0)
        if chat:
            message = choice.get("message") or {}
            chunks.append({**common, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}]})
            delta: dict[str, Any] = {}
            if message.get("content"):
                delta["content"] = message["content"]
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            if delta:
                chunks.append({**common, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]})
            chunks.append({**common, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                                  "finish_reason": choice.get("finish_reason")}]})
        else:
            chunks.append({**common, "choices": [{"index": index, "text": choice.get("text") or "", "logprobs": None,
                                                  "finish_reason": choice.get("finish_reason")}]})
    chunks.append({**common, "choices": [], "usage": response.get("usage")})
    return chunks
