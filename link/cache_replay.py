"""A cached answer between its two shapes: an OpenAI SSE stream -> one whole answer (`StreamRecorder`), and a
whole answer -> the chunks of a stream (`replay_chunks`), for the response cache (link/response_cache.py).

    assembler = StreamRecorder("chat")
    assembler.feed(b'data: {...}\\n\\n')          # each SSE frame the client was sent (keep-alives are skipped)
    whole = assembler.whole(usage)               # a chat.completion / text_completion dict; None if unusable
    for chunk in replay_chunks("chat", whole, pieces, include_usage=True): ...

A replayed stream has the shape of the gateway's own streams (link/proxy.py, after the mock and OpenAI): for chat,
per choice a role chunk (`delta: {"role": "assistant", "content": ""}`), one chunk per content piece, one per tool
call, a finish chunk (`delta: {}` and its `finish_reason`); for completions, one chunk per text piece and a finish
chunk. With `include_usage` every chunk carries `"usage": null` and a last chunk with empty `choices` carries the
usage. The pieces are the original stream's when the answer was cached from one, else the text cut before each
run of whitespace (a word per chunk).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

from link.proxy import ended_stream
from protocol.sse import frame

_PIECE = re.compile(r"\s*\S+|\s+")


def split_pieces(text: str) -> list[str]:
    """`text` cut into chunks of one word each, its leading whitespace included: "a b" -> ["a", " b"]."""
    return _PIECE.findall(text)


class StreamRecorder:
    """The whole answer of the chunks of an OpenAI stream (chat or completion), with each choice's content pieces."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict | None = None
        self.is_usable = True

    def feed(self, data: bytes) -> None:
        """Read one SSE frame (`data: {chunk}`, `data: [DONE]`, a comment); an error event makes it unusable."""
        for block in data.split(b"\n\n"):
            if not block.startswith(b"data: ") or block == b"data: [DONE]":
                continue
            chunk = json.loads(block[6:])
            if "error" in chunk and not chunk.get("choices"):
                self.is_usable = False
                continue
            if not self.head:
                self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                self._take(choice)

    def _take(self, choice: dict) -> None:
        state = self.choices.setdefault(int(choice.get("index") or 0),
                                        {"pieces": [], "tool_calls": {}, "refusal": "", "finish_reason": None})
        if choice.get("logprobs"):
            self.is_usable = False  # logprobs are not cached (link/response_cache.py)
        if choice.get("finish_reason"):
            state["finish_reason"] = choice["finish_reason"]
        if self.endpoint != "chat":
            if choice.get("text"):
                state["pieces"].append(choice["text"])
            return
        delta = choice.get("delta") or {}
        if delta.get("content"):
            state["pieces"].append(delta["content"])
        if delta.get("refusal"):
            state["refusal"] += delta["refusal"]
        for call in delta.get("tool_calls") or ():
            slot = state["tool_calls"].setdefault(int(call.get("index") or 0),
                                                  {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += function.get("name") or ""
            slot["function"]["arguments"] += function.get("arguments") or ""

    def whole(self, usage: dict | None) -> tuple[dict, list[list[str]]] | None:
        """(the whole answer, each choice's content pieces), or None when the stream failed, carried logprobs, or a
        choice never finished. `usage` stands in when the stream carried none."""
        if not self.is_usable or not self.choices or any(c["finish_reason"] is None for c in self.choices.values()):
            return None
        choices, pieces = [], []
        for index in sorted(self.choices):
            state = self.choices[index]
            pieces.append(state["pieces"])
            text = "".join(state["pieces"])
            if self.endpoint != "chat":
                choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": state["finish_reason"]})
                continue
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not state["tool_calls"] else None}
            if state["refusal"]:
                message["refusal"] = state["refusal"]
            if state["tool_calls"]:
                message["tool_calls"] = [state["tool_calls"][k] for k in sorted(state["tool_calls"])]
            choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": state["finish_reason"]})
        whole = {**self.head, "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
                 "choices": choices, "usage": self.usage or usage}
        return whole, pieces


def replay_chunks(endpoint: str, whole: dict, pieces: list[list[str]] | None, *, include_usage: bool,
                  usage: dict | None) -> Iterator[dict]:
    """The chunks of a stream that says what `whole` says (module docstring); `pieces[i]` cuts choice i's text
    (None: `split_pieces`); `usage` goes in the last chunk when `include_usage`."""
    is_chat = endpoint == "chat"
    head = {k: whole[k] for k in ("id", "created", "model", "system_fingerprint") if k in whole}
    head["object"] = "chat.completion.chunk" if is_chat else "text_completion"
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, finish_reason: str | None = None, **part) -> dict:
        choice = {"index": index, "delta": part} if is_chat else {"index": index, "text": part.get("text", "")}
        return {**head, "choices": [{**choice, "logprobs": None, "finish_reason": finish_reason}], **extra}

    for position, choice in enumerate(whole.get("choices") or ()):
        index = choice.get("index", position)
        message = choice.get("message") or {}
        text = (message.get("content") if is_chat else choice.get("text")) or ""
        cut = pieces[position] if pieces is not None and position < len(pieces) else split_pieces(text)
        if is_chat:
            yield chunk(index, role="assistant", content="")
            for piece in cut:
                yield chunk(index, content=piece)
            if message.get("refusal"):
                yield chunk(index, refusal=message["refusal"])
            for k, call in enumerate(message.get("tool_calls") or ()):
                yield chunk(index, tool_calls=[{"index": k, **call}])
            yield chunk(index, choice.get("finish_reason"))
        else:
            for piece in cut:
                yield chunk(index, text=piece)
            yield chunk(index, choice.get("finish_reason"), text="")
    if include_usage:
        yield {**head, "choices": [], "usage": usage}


@dataclass
class Hit:
    """A cached answer that serves one request: its whole form (`whole`) or a replayed stream (`frames`).
    `is_closed`/`close` let link/routes/openai.py's GatewayStream finish it like a backend stream."""

    endpoint: str
    entry: dict[str, Any]     # {"response": whole answer, "pieces": [[str]] | None}
    kind: str                 # "exact", "semantic" or "coalesced"
    is_closed: bool = False

    @property
    def model(self) -> str:
        return self.entry["response"].get("model") or ""

    def _fresh(self, record_id: str) -> dict:
        """The cached answer under a new id and creation time, `usage` marked."""
        response = json.loads(json.dumps(self.entry["response"]))
        prefix = "chatcmpl" if self.endpoint == "chat" else "cmpl"
        response["id"], response["created"] = f"{prefix}-{record_id}", int(time.time())
        response["usage"] = {**(response.get("usage") or {}), "link_cache": "hit"}
        return response

    def whole(self, record_id: str) -> dict:
        return self._fresh(record_id)

    def charge(self, record) -> None:
        """Account the request it serves (a `link.accounting.RequestRecord`) at cost 0: no deployment answered, no
        tokens were used (the original's usage is in `decision.cache.usage`)."""
        record.model, record.deployment = self.model or None, None
        record.prompt_tokens = record.completion_tokens = 0
        record.has_usage = True
        record.status, record.http_status = "ok", 200

    def stream(self, record, include_usage: bool) -> AsyncIterator[bytes]:
        """The answer as the SSE bytes of a stream, `data: [DONE]` last (its ending recorded as a backend stream's:
        `link.proxy.ended_stream`)."""
        record.mark_first_token()
        return ended_stream(self._frames(record.request_id, include_usage), record, self.close, "replaying a cached answer")

    async def _frames(self, record_id: str, include_usage: bool) -> AsyncIterator[bytes]:
        response = self._fresh(record_id)
        for chunk in replay_chunks(self.endpoint, response, self.entry.get("pieces"), include_usage=include_usage,
                                   usage=response["usage"]):
            yield frame(chunk)

    async def close(self, failure: BaseException | None = None) -> None:
        self.is_closed = True
