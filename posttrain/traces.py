"""Tool-call traces: conversations with tools that post-training learns from, and their readers.

A `Trace` is one conversation in OpenAI's chat form (messages with `tool_calls` and `tool` results, plus the
offered `tools`); the assistant turns are what the model learns to write. Readers:

- `read_openai_jsonl(path)`: OpenAI's fine-tuning format for function calling, one conversation a line,
  {"messages": [...], "tools": [...]} (an assistant message may carry "weight": 0 to be shown but not learned);
  the legacy {"functions": [...]} form with `function_call` / role "function" is converted to tools.
- BFCL items with their target calls: `posttrain/traces_bfcl.py` (`read_bfcl`).
- the gateway's request log: `posttrain/traces_log.py` (`read_request_log`).

    traces = read_openai_jsonl("calls.jsonl")          # -> [Trace(id="openai/3f2a...", ...), ...]

Every reader checks each trace (`check_trace`) and the whole set (`check_traces`) and raises
`PosttrainDataError` naming the file, line and field to fix, so bad data fails before any training.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from posttrain.errors import PosttrainDataError

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Trace:
    """One conversation to learn from.

    Attributes:
        id: unique per conversation; the train/validation split is by this id.
        messages: OpenAI chat messages; the assistant turns to learn carry `content` and/or `tool_calls`
            ({"id", "type": "function", "function": {"name", "arguments": JSON text}}); an assistant message
            with "weight": 0 is context only (OpenAI's fine-tuning convention).
        tools: OpenAI tools, [{"type": "function", "function": {"name", "description", "parameters"}}].
        meta: where it came from: {"source": "bfcl"|"openai"|"log", "category": ..., ...}.
    """

    id: str
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise PosttrainDataError(f"a trace id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.messages, list) or not isinstance(self.tools, list) or not isinstance(self.meta, dict):
            raise PosttrainDataError(f"trace {self.id}: messages and tools must be lists and meta a dict")

    @property
    def category(self) -> str | None:
        """meta["category"] (BFCL's category, a log's policy, ...), the stratum of the split."""
        return self.meta.get("category")

    @property
    def num_learned_turns(self) -> int:
        """Assistant turns the model learns (those without "weight": 0)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant" and m.get("weight", 1) != 0)


def _text(content: Any, where: str) -> str | None:
    """A message's content as text (None stays None); text parts only."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise PosttrainDataError(f"{where}: content must be a string or a list of {{\"type\": \"text\", \"text\": ...}} parts")


def tool_names(tools: Sequence[dict], where: str = "trace") -> list[str]:
    """The function names of OpenAI `tools`, checked: each is {"type": "function", "function": {"name": str, ...}},
    names unique. Raises PosttrainDataError naming the tool."""
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise PosttrainDataError(f'{where}: tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                                     f'"description": ..., "parameters": {{...}}}}}}')
        if not isinstance(fn.get("parameters", {}), dict):
            raise PosttrainDataError(f"{where}: tools[{i}] ({fn['name']}): parameters must be a JSON Schema object")
        if fn["name"] in names:
            raise PosttrainDataError(f"{where}: tools[{i}]: the function name {fn['name']!r} is offered twice")
        names.append(fn["name"])
    return names


def check_trace(trace: Trace, where: str | None = None) -> None:
    """Check that `trace` is a conversation post-training can learn from.

    Roles are system/developer/user/assistant/tool; content is text; every assistant message has content or
    tool_calls; a tool call is {"id": str, "type": "function", "function": {"name": an offered tool,
    "arguments": JSON text of an object}} with an id unique in the trace; a tool message answers an earlier
    call by its `tool_call_id`; at least one assistant turn is learned (weight not 0).

    Raises:
        PosttrainDataError: the first problem, prefixed with `where` (default: the trace id).
    """
    where = where or f"trace {trace.id}"
    offered = set(tool_names(trace.tools, where))
    if not trace.messages:
        raise PosttrainDataError(f"{where}: messages is empty")
    call_ids: set[str] = set()
    for i, m in enumerate(trace.messages):
        at = f"{where}: messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise PosttrainDataError(f"{at}: role must be one of {', '.join(ROLES)}, "
                                     f"got {m.get('role') if isinstance(m, dict) else m!r}")
        text = _text(m.get("content"), at)
        role = m["role"]
        if role == "assistant":
            if m.get("weight", 1) not in (0, 1):
                raise PosttrainDataError(f"{at}: weight must be 0 (context only) or 1 (learned), got {m['weight']!r}")
            calls = m.get("tool_calls")
            if calls is not None and (not isinstance(calls, list) or not calls):
                raise PosttrainDataError(f"{at}: tool_calls must be a non-empty list (omit it for a plain answer)")
            if not calls and not text:
                raise PosttrainDataError(f"{at}: an assistant message needs content or tool_calls")
            for j, call in enumerate(calls or ()):
                call_ids.add(_check_call(call, f"{at}.tool_calls[{j}]", offered, call_ids))
        elif role == "tool":
            if m.get("tool_call_id") not in call_ids:
                raise PosttrainDataError(f"{at}: a tool message must answer an earlier call: tool_call_id "
                                         f"{m.get('tool_call_id')!r} is not the id of a previous tool call")
        elif text is None:
            raise PosttrainDataError(f"{at}: a {role} message needs content")
    if trace.num_learned_turns == 0:
        raise PosttrainDataError(f"{where}: no assistant message to learn from (add the assistant's reply, "
                                 "or remove \"weight\": 0 from one)")


def _check_call(call: Any, at: str, offered: set[str], seen: set[str]) -> str:
    """The id of a well-formed tool call (see `check_trace`)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or call.get("type", "function") != "function":
        raise PosttrainDataError(f'{at} must be {{"id": ..., "type": "function", "function": {{"name": ..., "arguments": "{{...}}"}}}}')
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise PosttrainDataError(f"{at}: id must be a non-empty string")
    if call["id"] in seen:
        raise PosttrainDataError(f"{at}: the call id {call['id']!r} is used twice in this conversation")
    name = fn.get("name")
    if name not in offered:
        listed = ", ".join(sorted(offered)) or "none: this conversation has no tools"
        raise PosttrainDataError(f"{at}: calls {name!r}, which is not among the offered tools ({listed})")
    arguments = fn.get("arguments")
    if not isinstance(arguments, str):
        raise PosttrainDataError(f"{at} ({name}): arguments must be a JSON string of an object, as OpenAI sends them, "
                                 f"got {type(arguments).__name__}")
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise PosttrainDataError(f"{at} ({name}): arguments are not valid JSON ({exc})") from None
    if not isinstance(decoded, dict):
        raise PosttrainDataError(f"{at} ({name}): arguments must encode a JSON object, got {arguments!r}")
    return call["id"]


def check_traces(traces: Sequence[Trace], source: str) -> None:
    """Check a whole set: not empty, ids unique, at least one trace offers tools.

    Raises:
        PosttrainDataError: naming `source` (a file, "the request log", ...).
    """
    if not traces:
        raise PosttrainDataError(f"{source} holds no conversations; post-training needs at least one")
    seen: set[str] = set()
    for t in traces:
        if t.id in seen:
            raise PosttrainDataError(f"{source}: the trace id {t.id!r} occurs twice; ids must be unique per conversation")
        seen.add(t.id)
    if not any(t.tools for t in traces):
        raise PosttrainDataError(f"none of the {len(traces)} conversations in {source} offers tools; post-training "
                                 "teaches a harness's tool calls: give each conversation its `tools` "
                                 '([{"type": "function", "function": {"name", "description", "parameters"}}])')


# --- OpenAI fine-tuning JSONL -------------------------------------------------------------------------------


def _from_legacy_functions(row: dict) -> dict:
    """A legacy {"functions", function_call, role "function"} conversation in the tools form."""
    tools = [{"type": "function", "function": fn} for fn in row.get("functions") or []]
    messages, last_id, k = [], None, 0
    for m in row.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("function_call"), dict):
            last_id, k = f"call_{k}", k + 1
            m = {key: v for key, v in m.items() if key != "function_call"} | {
                "tool_calls": [{"id": last_id, "type": "function", "function": m["function_call"]}]}
        elif isinstance(m, dict) and m.get("role") == "function":
            m = {"role": "tool", "tool_call_id": last_id, "name": m.get("name"), "content": m.get("content")}
        messages.append(m)
    return {**row, "messages": messages, "tools": tools}


def _content_id(row: dict) -> str:
    """An id from the conversation's content: the same conversation twice gets the same id (one side of the split)."""
    canonical = json.dumps({"messages": row["messages"], "tools": row.get("tools") or []}, sort_keys=True, ensure_ascii=False)
    return f"openai/{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def read_openai_jsonl(path: str | Path) -> list[Trace]:
    """Read OpenAI fine-tuning JSONL: one {"messages": [...], "tools": [...]} per line (blank lines skipped).

    An optional "id" (string) names the conversation, else the id is a hash of its content; an optional
    "category" (string) becomes meta["category"] (the split's stratum). The legacy "functions" form is accepted.

    Returns:
        One `Trace` per line, meta {"source": "openai", "path", "line", "category"}.
    Raises:
        PosttrainDataError: a missing file, a line that is not a JSON object with a `messages` list, a malformed
            conversation (see `check_trace`; the message names the line), or a file whose conversations
            offer no tools, or none at all.
    """
    path = Path(path)
    if not path.is_file():
        raise PosttrainDataError(f"trace file not found: {path}")
    traces = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PosttrainDataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise PosttrainDataError(f'{where}: each line must be a JSON object {{"messages": [...], "tools": [...]}}')
        if "functions" in row and "tools" not in row:
            row = _from_legacy_functions(row)
        tools = row.get("tools") or []
        if not isinstance(tools, list):
            raise PosttrainDataError(f"{where}: tools must be a list")
        trace_id = row.get("id") if isinstance(row.get("id"), str) and row.get("id") else _content_id(row)
        category = row.get("category") if isinstance(row.get("category"), str) else None
        trace = Trace(trace_id, row["messages"], tools, {"source": "openai", "path": str(path), "line": n, "category": category})
        check_trace(trace, where)
        traces.append(trace)
    check_traces(traces, str(path))
    return traces
