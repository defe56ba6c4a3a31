"""Traces -> token ids for supervised fine-tuning, with the loss only on the assistant's tokens.

A trace is rendered exactly as the engine renders a chat request to a local model (`serving.frontend.responses.
plan_chat`): `serving.tools.harness.render_messages` writes the tools into the system turn and the calls and results
as text in the harness format, the model's chat template (`serving.text.chat_format.TemplateChatFormat`) turns the
messages into text, and our tokenizer (`serving.text.tokenizer.Tokenizer`) into ids. So the tokens before each
assistant turn are, token for token, the prompt the engine builds when a client sends that conversation.
The harness format (`serving.tools.formats.ToolCallFormat`, `tool_format=`) must be the deployment's
(link.yaml `tool_format:`); traces are rendered strictly: a schema the format cannot express, or a call that
would not parse back, is refused before training. A chat template that renders tools itself (Qwen2.5's, under the
default format; `serving.tools.harness.native_tool_format`) gets them as the engine hands them: the tools to the
template (its own `# Tools` section), results as "tool" messages for it to wrap (`serving_tool_format`).

For every learned assistant turn (OpenAI's "weight": 0 marks a turn as context only):

    prefix  = render(messages before the turn, add_generation_prompt=True)    # the serving prompt
    full    = render(all messages, add_generation_prompt=False)               # the whole conversation
    labels  = full's ids from len(prefix ids) through the first end-of-turn id (included, so the model
              learns to stop); -100 everywhere else

`prefix` must tokenize to a prefix of `full`; a chat template or tokenizer that breaks this (a template
that rewrites earlier turns, a merge across the turn boundary) raises `PosttrainDataError`. Ids after the
last learned turn are cut off (they carry no loss and, under causal attention, change no logit before them).

Too long: an example longer than `max_seq_length` tokens is dropped and counted (`TraceDataset.dropped`),
not truncated: a cut would leave a half-written call, teaching the model to write calls that do not parse
and, with the end-of-turn token gone, not to stop.

Split: `split_traces(traces, val_fraction, seed)` assigns whole conversations (trace ids), per category, so
that each category keeps the ratio, the same seed always gives the same split, and order does not matter.

    tokenizer, chat_format = load_chat_tokenizer("smollm2-135m-instruct")     # no weights loaded
    train, val = split_traces(read_bfcl(data_dir), val_fraction=0.3, seed=0)   # posttrain.traces_bfcl
    data = TraceDataset(train, tokenizer, chat_format, max_seq_length=1024)  # data[i]: Example
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace, check_trace

IGNORE_INDEX = -100  # no loss (torch.nn.functional.cross_entropy's ignore_index)


@dataclass(frozen=True)
class Example:
    """One training sequence.

    Attributes:
        trace_id: the trace it came from.
        input_ids: token ids of the rendered conversation (up to the end of its last learned turn).
        labels: same length; the token id where the loss applies (assistant tokens), IGNORE_INDEX elsewhere.
    """

    trace_id: str
    input_ids: list[int]
    labels: list[int]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise ValueError(f"{self.trace_id}: {len(self.input_ids)} input ids but {len(self.labels)} labels")

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_label_tokens(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE_INDEX)


def load_chat_tokenizer(model: Any, registry: Any = None) -> tuple[Any, Any]:
    """The tokenizer and chat format the engine uses for a local model, without loading its weights.

    Follows `serving.model_loader.load_model`: a GGUF file's own tokenizer and chat template, or a safetensors
    folder's tokenizer files.

    Args:
        model: a registered model name or a `serving.registry.ModelSpec`.
        registry: a `ModelRegistry` (default: `serving.registry.default_registry()`).
    Returns:
        (serving.text.tokenizer.Tokenizer, serving.text.chat_format.TemplateChatFormat).
    Raises:
        PosttrainDataError: the model has no chat template (a base model with the in-context format: training
            needs a template that marks where the assistant's turn ends). UnknownModelError, ModelFileError:
            from the registry.
    """
    from serving.loader.gguf_loader import open_gguf
    from serving.registry import ModelSpec, default_registry
    from serving.text.chat_format import TemplateChatFormat
    from serving.text.tokenizer import Tokenizer

    spec = model if isinstance(model, ModelSpec) else (registry or default_registry()).get(model)
    if spec.chat_format != "template":
        raise PosttrainDataError(f"{spec.name!r} uses the {spec.chat_format!r} chat format; post-training needs a model "
                                 "with a chat template (its turns end with an end-of-turn token to learn)")
    path = spec.resolve_path()
    if path.is_dir():
        tokenizer = Tokenizer.from_folder(path if spec.tokenizer == "model" else spec.tokenizer)
    elif spec.tokenizer == "model":
        tokenizer = Tokenizer.from_gguf(path, open_gguf(path).metadata)
    else:
        tokenizer = Tokenizer.from_folder(spec.tokenizer)
    if not tokenizer.chat_template:
        raise PosttrainDataError(f"{spec.name!r} ({path}) has no chat template to render training conversations with")
    return tokenizer, TemplateChatFormat(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)


def render_conversation(chat_format: Any, messages: Sequence[dict], add_generation_prompt: bool,
                        tools: Sequence[dict] | None = None) -> str:
    """`messages` through the chat template; `add_generation_prompt=True` is exactly `chat_format.render`.
    `tools`: OpenAI tools for a template that renders them itself (`template_tools`), else None."""
    if add_generation_prompt:
        return chat_format.render(messages, tools=tools)
    from serving.text.chat_format import normalize_messages

    # TemplateChatFormat.render always adds the generation prompt; the same compiled template without it.
    extra = {"tools": list(tools)} if tools and chat_format.renders_tools else {}
    return chat_format._compiled.render(messages=normalize_messages(messages), add_generation_prompt=False,
                                        bos_token=chat_format.bos_token or "", eos_token=chat_format.eos_token or "",
                                        **extra)


def resolve_tool_format(tool_format: Any = None) -> Any:
    """A `serving.tools.formats.ToolCallFormat` from None (the default JSON format), a registered name ("xml"),
    a dict of fields (as link.yaml's `tool_format:`), or a format. Raises PosttrainDataError for a bad one."""
    from serving.errors import ServingError
    from serving.tools.formats import tool_format_from_config

    try:
        return tool_format_from_config(tool_format)
    except ServingError as exc:
        raise PosttrainDataError(str(exc)) from None


def serving_tool_format(chat_format: Any, tool_format: Any = None) -> tuple[Any, bool]:
    """(the harness format, native) as the engine's chat path picks them for a model with `chat_format`:
    `serving.tools.harness.native_tool_format`. Native (Qwen2.5's template under the default format): the template
    renders the tools and results itself, and replies are parsed with `fenced_calls="call"`.

    Args:
        tool_format: see `resolve_tool_format` (None: the default JSON format).
    Raises:
        PosttrainDataError: a bad tool format.
    """
    from serving.tools.harness import native_tool_format

    fmt = resolve_tool_format(tool_format)
    native = native_tool_format(chat_format, fmt)
    return (fmt, False) if native is None else (native, True)


def template_tools(trace: Trace, native: bool) -> list[dict] | None:
    """The tools the chat template gets for `trace`: its tools when the template renders them (`native`) and
    meta "tool_choice" is not "none", as `prepare_chat` sets `ChatSetup.template_tools`; else None."""
    if native and trace.tools and trace.meta.get("tool_choice") != "none":
        return list(trace.tools)
    return None


def harness_messages(trace: Trace, tool_format: Any = None, native: bool = False) -> list[dict]:
    """The trace's messages as the engine hands them to the chat template: `serving.tools.harness.render_messages`
    in the harness format, with meta "tool_choice" (default "auto") and "parallel_tool_calls" (default True)
    as `serving.frontend.chat_tools.prepare_chat` passes them, and `strict`: tools the format cannot express, or an
    assistant turn that would not parse back to the same content and calls, are refused.

    Args:
        tool_format: see `resolve_tool_format` (None: the default JSON format).
        native: the chat template renders the tools itself (`serving_tool_format`): no tools text in the system
            turn, results stay "tool" messages; pass `template_tools(trace, native)` to the template.
    Raises:
        PosttrainDataError: tools or messages the harness format cannot render (the message says which).
    """
    from serving.errors import ServingError
    from serving.tools.harness import render_messages

    messages = trace.messages
    if not (trace.tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)):
        return [dict(m) for m in messages]
    fmt = resolve_tool_format(tool_format)
    try:
        return render_messages(messages, trace.tools or None, trace.meta.get("tool_choice") or "auto",
                               trace.meta.get("parallel_tool_calls", True) is not False, fmt=fmt, strict=True,
                               native=native)
    except ServingError as exc:
        raise PosttrainDataError(f"trace {trace.id}: the {fmt.name!r} tool format cannot carry it: {exc}") from None


def encode_trace(trace: Trace, tokenizer: Any, chat_format: Any, tool_format: Any = None) -> Example:
    """One trace as an `Example` (no length limit; see the module docstring for the labels).

    Raises:
        PosttrainDataError: no learned assistant turn, an assistant turn with nothing before it, a chat template
            whose prompt is not a token prefix of the conversation, or a turn with no end-of-turn token.
    """
    from serving.errors import ServingError

    learned = [m.get("weight", 1) != 0 for m in trace.messages if m.get("role") == "assistant"]
    fmt, native = serving_tool_format(chat_format, tool_format)
    rendered = harness_messages(trace, fmt, native)
    tools = template_tools(trace, native)
    turns = [k for k, m in enumerate(rendered) if m.get("role") == "assistant"]
    assert len(turns) == len(learned), "render_messages keeps one assistant message per assistant message"
    if not any(learned):
        raise PosttrainDataError(f"trace {trace.id}: no assistant turn to learn from")
    special = chat_format.add_special_tokens
    try:
        full_ids = tokenizer.encode(render_conversation(chat_format, rendered, False, tools), add_special_tokens=special)
        labels = [IGNORE_INDEX] * len(full_ids)
        end = 0
        for k, is_learned in zip(turns, learned):
            if not is_learned:
                continue
            if k == 0:
                raise PosttrainDataError(f"trace {trace.id}: the conversation opens with an assistant turn; "
                                         "start it with a system or user message")
            prefix_ids = tokenizer.encode(chat_format.render(rendered[:k], tools=tools), add_special_tokens=special)
            start = len(prefix_ids)
            if full_ids[:start] != prefix_ids:
                at = next((i for i, (a, b) in enumerate(zip(prefix_ids, full_ids)) if a != b), min(start, len(full_ids)))
                raise PosttrainDataError(
                    f"trace {trace.id}: the chat template's prompt for assistant turn {k} is not a token prefix of the "
                    f"whole conversation (they differ at token {at}: {tokenizer.decode(prefix_ids[at:at + 8], False)!r} "
                    f"vs {tokenizer.decode(full_ids[at:at + 8], False)!r}); use a template that renders earlier turns "
                    "the same way with and without later ones")
            stop = next((i for i in range(start, len(full_ids)) if full_ids[i] in tokenizer.eos_token_ids), None)
            if stop is None or stop == start:
                raise PosttrainDataError(f"trace {trace.id}: assistant turn {k} has no text or no end-of-turn token "
                                         f"(one of ids {tokenizer.eos_token_ids}) after it in the chat template")
            labels[start:stop + 1] = full_ids[start:stop + 1]
            end = stop + 1
    except ServingError as exc:  # the template refused the messages (raise_exception) or non-text content
        raise PosttrainDataError(f"trace {trace.id}: {exc}") from None
    return Example(trace.id, full_ids[:end], labels[:end])


class TraceDataset(Sequence[Example]):
    """Traces rendered and tokenized for one model, those longer than `max_seq_length` dropped.

    Args:
        traces: the traces (e.g. one side of `split_traces`).
        tokenizer, chat_format: from `load_chat_tokenizer` (or `serving.model_loader.load_model`).
        max_seq_length: most tokens per example (≥ 1); longer examples are dropped and counted.
        tool_format: the harness format: a `serving.tools.formats.ToolCallFormat`, a registered name ("xml"), a
            dict of its fields (link.yaml `tool_format:`), or None (the default JSON format); the same as the
            model's deployment, so serving parses what training taught.
        skip_invalid: leave out (and list in `invalid`) traces that fail `check_trace` or `encode_trace`, e.g.
            a logged reply whose call names no offered tool, instead of raising.
    Attributes:
        examples: the kept examples, in trace order; dropped: ids of the traces longer than max_seq_length;
        invalid: (trace id, reason) of the traces left out by `skip_invalid`.
    Raises:
        PosttrainDataError: no traces, a trace that fails `check_trace` or `encode_trace` (unless skip_invalid),
            no valid trace, or every example longer than max_seq_length (the message gives the shortest length).
    """

    def __init__(self, traces: Sequence[Trace], tokenizer: Any, chat_format: Any, *, max_seq_length: int = 1024,
                 tool_format: Any = None, skip_invalid: bool = False):
        if max_seq_length < 1:
            raise PosttrainDataError(f"max_seq_length must be at least 1, got {max_seq_length}")
        if not traces:
            raise PosttrainDataError("the dataset is empty: no traces to train on")
        self.max_seq_length = max_seq_length
        tool_format = resolve_tool_format(tool_format)
        self.invalid: list[tuple[str, str]] = []
        encoded = []
        for trace in traces:
            try:
                check_trace(trace)
                encoded.append(encode_trace(trace, tokenizer, chat_format, tool_format))
            except PosttrainDataError as exc:
                if not skip_invalid:
                    raise
                self.invalid.append((trace.id, str(exc)))
        if not encoded:
            raise PosttrainDataError(f"none of the {len(traces)} traces can be trained on; the first: {self.invalid[0][1]}")
        self.examples = [e for e in encoded if e.num_tokens <= max_seq_length]
        self.dropped = [e.trace_id for e in encoded if e.num_tokens > max_seq_length]
        if not self.examples:
            raise PosttrainDataError(f"all {len(encoded)} examples are longer than max_seq_length={max_seq_length} "
                                     f"(the shortest has {min(e.num_tokens for e in encoded)} tokens); raise max_seq_length")

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    @property
    def num_dropped(self) -> int:
        return len(self.dropped)

    def stats(self) -> dict[str, float]:
        """Counts and token statistics of the kept examples: num_examples, num_dropped, num_invalid,
        num_tokens, num_label_tokens, mean_tokens, max_tokens."""
        lengths = [e.num_tokens for e in self.examples]
        return {"num_examples": len(lengths), "num_dropped": self.num_dropped, "num_invalid": len(self.invalid),
                "num_tokens": sum(lengths),
                "num_label_tokens": sum(e.num_label_tokens for e in self.examples),
                "mean_tokens": statistics.fmean(lengths), "max_tokens": max(lengths)}


def _rank(seed: int, trace_id: str) -> str:
    """A seeded pseudo-random sort key of an id, independent of the other ids and of their order."""
    return hashlib.sha256(f"{seed}\0{trace_id}".encode()).hexdigest()


def split_traces(traces: Sequence[Trace], val_fraction: float, seed: int = 0) -> tuple[list[Trace], list[Trace]]:
    """Split by conversation (trace id) into train and validation, stratified by `Trace.category`.

    In each category (None is one), the distinct ids are ordered by a seeded hash and the first
    round(n * val_fraction) go to validation: the split depends only on (ids, categories, seed), not on the
    input order, and traces sharing an id stay together.

    Args:
        val_fraction: share of each category's conversations for validation, 0 <= val_fraction < 1.
    Returns:
        (train, val), each in input order.
    Raises:
        PosttrainDataError: val_fraction out of range, or an id whose traces have different categories.
    """
    if not 0 <= val_fraction < 1:
        raise PosttrainDataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    category_of: dict[str, Any] = {}
    by_category: dict[Any, list[str]] = defaultdict(list)
    for t in traces:
        if t.id in category_of:
            if category_of[t.id] != t.category:
                raise PosttrainDataError(f"trace id {t.id!r} has traces in categories {category_of[t.id]!r} and {t.category!r}")
            continue
        category_of[t.id] = t.category
        by_category[t.category].append(t.id)
    val_ids: set[str] = set()
    for ids in by_category.values():
        ids.sort(key=lambda i: _rank(seed, i))
        val_ids.update(ids[:round(len(ids) * val_fraction)])
    return [t for t in traces if t.id not in val_ids], [t for t in traces if t.id in val_ids]
