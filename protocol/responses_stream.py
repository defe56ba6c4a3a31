"""The Responses API's server-sent events, built from a chat completion stream's chunks.

    stream = ResponseStream(request, response_id, created_at, model)
    events = stream.start()                          # response.created, response.in_progress
    events = stream.add(chunk)                       # per chat chunk: items opened, text / argument deltas
    events = stream.finish()                         # items closed; response.completed (or .incomplete)
    events = stream.fail(code, message)              # instead of finish: response.failed
    wire = b"".join(event_frame(e) for e in events)  # `event: <type>` + `data: <json>`, no `[DONE]`

Every event carries `type` and `sequence_number` (0, 1, 2, ... over the stream), as OpenAI's do. The events of an
output item, in order: response.output_item.added; for a message, response.content_part.added, then
response.output_text.delta per text piece, response.output_text.done, response.content_part.done; for a
function call, response.function_call_arguments.delta per piece, response.function_call_arguments.done; then
response.output_item.done. Item ids and texts in the final `response` equal those of the events, and the final
response equals what `protocol.responses.whole_response` gives for the same answer (the item ids aside).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from protocol.responses import (INCOMPLETE_REASONS, ResponsesRequest, function_call_item, message_item, new_id,
                                response_object)


def event_frame(event: dict) -> bytes:
    """One server-sent event as OpenAI sends Responses events: `event: <type>` then `data: <json>`."""
    return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class _Item:
    item_id: str
    output_index: int
    kind: str                    # "message" or "function_call"
    parts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


@dataclass
class ResponseStream:
    """The state of one streamed response: the open items, the finish reason and usage seen so far."""

    request: ResponsesRequest
    response_id: str
    created_at: int
    model: str
    num_events: int = 0
    items: list[_Item] = field(default_factory=list)
    open_message: _Item | None = None
    calls: dict[int, _Item] = field(default_factory=dict)  # chat tool-call index -> its item
    finish_reason: str | None = None
    usage: dict | None = None
    final: dict | None = None  # the last response object sent (completed, incomplete or failed)

    def _event(self, kind: str, **fields: Any) -> dict:
        event = {"type": kind, "sequence_number": self.num_events, **fields}
        self.num_events += 1
        return event

    def _response(self, status: str, error: dict | None = None) -> dict:
        output = [self._item(item, "completed" if status == "completed" else "incomplete") for item in self.items] \
            if status != "in_progress" else []
        return response_object(self.request, self.response_id, self.created_at, self.model, output=output,
                               status=status, finish_reason=self.finish_reason,
                               usage=self.usage if status != "in_progress" else None, error=error)

    def _item(self, item: _Item, status: str) -> dict:
        if item.kind == "message":
            return message_item(item.item_id, "".join(item.parts), None, status)
        return function_call_item(item.item_id, item.call_id, item.name, "".join(item.parts), status)

    def start(self) -> list[dict]:
        response = self._response("in_progress")
        return [self._event("response.created", response=response), self._event("response.in_progress", response=response)]

    def add(self, chunk: dict) -> list[dict]:
        """The events of one chat completion chunk (its first choice; a usage chunk only updates the usage)."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("model"):
            self.model = chunk["model"]
        events: list[dict] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                events += self._text(delta["content"])
            for piece in delta.get("tool_calls") or ():
                events += self._call(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _text(self, text: str) -> list[dict]:
        events = []
        item = self.open_message
        if item is None:
            events += self._close_all()
            item = self.open_message = _Item(new_id("msg"), len(self.items), "message")
            self.items.append(item)
            events.append(self._event("response.output_item.added", output_index=item.output_index,
                                      item=message_item(item.item_id, None, None, "in_progress")))
            events.append(self._event("response.content_part.added", item_id=item.item_id, output_index=item.output_index,
                                      content_index=0, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        item.parts.append(text)
        events.append(self._event("response.output_text.delta", item_id=item.item_id, output_index=item.output_index,
                                  content_index=0, delta=text, logprobs=[]))
        return events

    def _call(self, piece: dict) -> list[dict]:
        events = []
        index = int(piece.get("index", len(self.calls)))
        function = piece.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            events += self._close_all()
            item = _Item(new_id("fc"), len(self.items), "function_call", call_id=piece.get("id") or new_id("call"),
                         name=function.get("name") or "")
            self.items.append(item)
            self.calls[index] = item
            events.append(self._event("response.output_item.added", output_index=item.output_index,
                                      item=function_call_item(item.item_id, item.call_id, item.name, "", "in_progress")))
        arguments = function.get("arguments")
        if arguments:
            item.parts.append(arguments)
            events.append(self._event("response.function_call_arguments.delta", item_id=item.item_id,
                                      output_index=item.output_index, delta=arguments))
        return events

    def _close(self, item: _Item, status: str) -> list[dict]:
        events = []
        text = "".join(item.parts)
        if item.kind == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            events.append(self._event("response.output_text.done", item_id=item.item_id, output_index=item.output_index,
                                      content_index=0, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=item.item_id, output_index=item.output_index,
                                      content_index=0, part=part))
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item.item_id,
                                      output_index=item.output_index, name=item.name, arguments=text))
        events.append(self._event("response.output_item.done", output_index=item.output_index, item=self._item(item, status)))
        return events

    def _close_all(self, status: str = "completed") -> list[dict]:
        """Close the open message and the open calls (a new item starts, or the stream ends)."""
        events = []
        open_items = ([self.open_message] if self.open_message else []) + list(self.calls.values())
        for item in sorted(open_items, key=lambda i: i.output_index):
            events += self._close(item, status)
        self.open_message = None
        self.calls = {}
        return events

    def finish(self) -> list[dict]:
        """The closing events: open items done, then response.completed, or response.incomplete when the chat
        answer stopped at its token limit (finish_reason "length") or a content filter."""
        is_incomplete = self.finish_reason in INCOMPLETE_REASONS
        events = self._close_all("incomplete" if is_incomplete else "completed")
        self.final = self._response("incomplete" if is_incomplete else "completed")
        return [*events, self._event("response.incomplete" if is_incomplete else "response.completed", response=self.final)]

    def fail(self, code: str, message: str) -> list[dict]:
        """A stream that broke after its first event: response.failed with `error` {code, message}."""
        self.final = self._response("failed", error={"code": code, "message": message})
        return [self._event("response.failed", response=self.final)]
