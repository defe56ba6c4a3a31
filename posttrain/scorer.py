"""Tool-call scoring: a local model's calls on traces with a gold answer, before and after post-training.

For each trace the conversation up to (not including) its final assistant turn is the prompt, rendered exactly
as the gateway renders a chat request with `tools` to a local model (`serving.frontend.responses.plan_chat`): the
harness format writes the tools into the system turn (`posttrain.dataset.harness_messages`, the rendering the
dataset trains on), or, for a template that renders tools itself (Qwen2.5's), the template gets them
(`posttrain.dataset.serving_tool_format`); the model's chat template turns the messages into text and our
tokenizer into ids. Our
engine answers all prompts in one `generate` call (continuous batching), greedily, up to `max_tokens` tokens or
the end of the turn; the reply is parsed as the gateway parses it (`serving.tools.harness.parse_tool_calls`, `cut`
when the reply hit max_tokens) and graded against the final assistant turn:

- BFCL traces (`posttrain.traces_bfcl.read_bfcl`: meta "functions", "ground_truth"): the calls, their OpenAI
  names mapped back to BFCL's (`evals.bfcl_schema.decode_tool_calls`), are matched by BFCL's AST grader
  (`evals.bfcl_match.match_calls`), as `evals.suites.bfcl` grades `link eval run`; an irrelevance item is right
  when no call is made.
- other traces (OpenAI JSONL, the request log): exact match of the multiset of (name, arguments) with the
  final assistant turn's `tool_calls` (arguments compared as decoded JSON); a turn without calls is right when
  no call is made.

Metrics (`ScoreResult`): accuracy overall and per category (the share of items graded right; BFCL's "AST
accuracy"), the accuracy on the items whose gold answer makes calls (all but irrelevance), the parse share (outputs in which every call block the model opened is a well-formed call of an
offered function with object arguments; plain text without a block counts as parsed), and irrelevance
accuracy (the share of items whose gold answer makes no call that the model answered without a call). As in
the gateway (and BFCL), a block that does not parse is not a call: it lowers the parse share, and on an
irrelevance item it is graded as no call.

    scorer = ToolCallScorer("smollm2-135m-instruct")            # or an exported folder: "models/acme-tools"
    result = scorer.score(val_traces)                            # -> ScoreResult
    console.print(render_table(result)); print(summary_line(result)); result.write_jsonl("items.jsonl")
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ItemScore:
    """One trace's outcome.

    Attributes:
        id, category: the trace's id and `Trace.category`.
        output: the model's reply text.
        calls: the parsed calls [{"name", "arguments": dict}] (BFCL names for BFCL traces, as graded).
        parsed: every call block in the output is a well-formed call (see the module docstring).
        correct: graded right; reason: why not ("" when right).
        expects_call: the gold answer makes at least one call (False: irrelevance / a plain-text answer).
        finish_reason: the engine's ("stop", "length"); prompt_tokens, output_tokens: token counts.
    """

    id: str
    category: str | None
    output: str
    calls: tuple[dict, ...]
    parsed: bool
    correct: bool
    reason: str
    expects_call: bool
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0

    def to_json(self) -> dict:
        return {"id": self.id, "category": self.category, "correct": self.correct, "parsed": self.parsed,
                "reason": self.reason, "expects_call": self.expects_call, "calls": list(self.calls),
                "output": self.output, "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class CategoryScore:
    """Counts of one category (or "all")."""

    category: str
    n: int
    correct: int
    parsed: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def parse_rate(self) -> float:
        return self.parsed / self.n if self.n else 0.0


@dataclass(frozen=True)
class ScoreResult:
    """A model's scores on a set of traces.

    Attributes:
        model: the model as given; tool_format: the harness format's name; max_tokens: the reply budget.
        items: one `ItemScore` per trace, in input order.
        wall_s: seconds of the whole scoring (rendering, generation, grading; not the model load);
        generate_s: seconds of the engine's generate call.
    """

    model: str
    items: tuple[ItemScore, ...]
    tool_format: str = "json"
    max_tokens: int = DEFAULT_MAX_TOKENS
    wall_s: float = 0.0
    generate_s: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        """Share of items graded right (0..1)."""
        return sum(i.correct for i in self.items) / len(self.items) if self.items else 0.0

    @property
    def parse_rate(self) -> float:
        """Share of outputs whose call blocks all parse (0..1)."""
        return sum(i.parsed for i in self.items) / len(self.items) if self.items else 0.0

    @property
    def call_accuracy(self) -> float | None:
        """Share of the items whose gold answer makes calls that were graded right (BFCL: every category but
        irrelevance); None without such items."""
        calls = [i for i in self.items if i.expects_call]
        return sum(i.correct for i in calls) / len(calls) if calls else None

    @property
    def irrelevance_accuracy(self) -> float | None:
        """Share of the items whose gold answer makes no call answered without a call; None without such items."""
        no_call = [i for i in self.items if not i.expects_call]
        return sum(i.correct for i in no_call) / len(no_call) if no_call else None

    @property
    def categories(self) -> dict[str, CategoryScore]:
        """Per category (in first-seen order; None shows as "-"), then "all"."""
        order: dict[str, list[ItemScore]] = {}
        for item in self.items:
            order.setdefault(item.category or "-", []).append(item)
        out = {c: CategoryScore(c, len(xs), sum(x.correct for x in xs), sum(x.parsed for x in xs)) for c, xs in order.items()}
        out["all"] = CategoryScore("all", len(self.items), sum(x.correct for x in self.items),
                                   sum(x.parsed for x in self.items))
        return out

    def metrics(self) -> dict:
        """The summary as JSON-ready data (fractions in 0..1, times in seconds)."""
        output_tokens = sum(i.output_tokens for i in self.items)
        return {"model": self.model, "tool_format": self.tool_format, "max_tokens": self.max_tokens,
                "num_items": len(self.items), "accuracy": self.accuracy, "parse_rate": self.parse_rate,
                "call_accuracy": self.call_accuracy, "irrelevance_accuracy": self.irrelevance_accuracy,
                "categories": {c: {"n": s.n, "accuracy": s.accuracy, "parse_rate": s.parse_rate}
                               for c, s in self.categories.items() if c != "all"},
                "finish_reasons": dict(Counter(i.finish_reason for i in self.items)),
                "prompt_tokens": sum(i.prompt_tokens for i in self.items), "output_tokens": output_tokens,
                "wall_s": self.wall_s, "generate_s": self.generate_s,
                "output_tokens_per_s": output_tokens / self.generate_s if self.generate_s else None, **self.meta}

    def write_jsonl(self, path: str | Path) -> Path:
        """One `ItemScore.to_json()` per line."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(i.to_json(), ensure_ascii=False) + "\n" for i in self.items))
        return path

    def write_metrics(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.metrics(), indent=2) + "\n")
        return path


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary_line(result: ScoreResult) -> str:
    """One line: accuracy overall, on items with calls, on irrelevance, the parse share and the times."""
    return (f"accuracy {_pct(result.accuracy)} (items with calls {_pct(result.call_accuracy)}, irrelevance "
            f"{_pct(result.irrelevance_accuracy)}), parsed {_pct(result.parse_rate)}, {len(result.items)} items in "
            f"{result.wall_s:.1f} s ({result.generate_s:.1f} s generating)")


def render_table(result: ScoreResult, title: str | None = None):
    """A Rich table: per category the items, accuracy and parse share (percent), then all (`summary_line`
    gives the rest)."""
    from rich.table import Table

    table = Table(title=title or f"{Path(result.model).name}: tool calls ({result.tool_format} format)")
    for column in ("category", "items", "accuracy %", "parsed %"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for name, s in result.categories.items():
        style = "bold" if name == "all" else None
        table.add_row(name, str(s.n), f"{100 * s.accuracy:.1f}", f"{100 * s.parse_rate:.1f}", style=style)
    return table


# --- rendering and grading (no model needed) ----------------------------------------------------------------


def _format(tool_format: Any):
    """`tool_format` as a `serving.tools.formats.ToolCallFormat` (None = the default JSON format)."""
    from posttrain.dataset import resolve_tool_format

    return resolve_tool_format(tool_format)


def prompt_messages(trace: Trace, tool_format: Any = None, native: bool = False) -> list[dict]:
    """The messages the chat template gets for `trace` without its final assistant turn (the gateway's
    rendering of a request with the trace's tools, `posttrain.dataset.harness_messages`; `native`: the template
    renders the tools itself, `posttrain.dataset.serving_tool_format`).

    Raises:
        PosttrainDataError: the trace does not end with an assistant turn, or has nothing before it; or tools
            the harness format cannot render.
    """
    from posttrain.dataset import harness_messages

    if not trace.messages or trace.messages[-1].get("role") != "assistant":
        raise PosttrainDataError(f"trace {trace.id}: the last message must be the assistant's gold answer to score against")
    if len(trace.messages) < 2:
        raise PosttrainDataError(f"trace {trace.id}: nothing before the gold answer to prompt with")
    prompt = Trace(trace.id, trace.messages[:-1], trace.tools, trace.meta)
    return harness_messages(prompt, tool_format, native)


def _canonical_calls(calls) -> list[tuple[str, str]]:
    return sorted((c.name, json.dumps(c.arguments, sort_keys=True, ensure_ascii=False)) for c in calls)


def exact_match(calls, gold_tool_calls: Sequence[dict] | None) -> tuple[bool, str]:
    """Whether `calls` (evals.bfcl_schema.Call) equal the gold OpenAI `tool_calls` as a multiset of (name,
    decoded arguments); the reason when not."""
    from evals.bfcl_schema import decode_tool_calls

    gold = decode_tool_calls(list(gold_tool_calls or []), {})
    if not gold:
        return (not calls, "" if not calls else f"expected no call, got {len(calls)}")
    if len(calls) != len(gold):
        return False, f"expected {len(gold)} call(s), got {len(calls)}"
    want, got = _canonical_calls(gold), _canonical_calls(calls)
    if want == got:
        return True, ""
    missing = [w for w in want if w not in got]
    return False, f"no call {missing[0][0]}({missing[0][1]})" if missing else "the calls differ"


def _is_bfcl(trace: Trace) -> bool:
    return trace.meta.get("source") == "bfcl" and "ground_truth" in trace.meta and "functions" in trace.meta


def _expects_call(trace: Trace) -> bool:
    """Whether the gold answer makes a call (BFCL: a non-empty ground truth; else the final turn's tool_calls)."""
    if _is_bfcl(trace):
        return bool(trace.meta["ground_truth"])
    return bool(trace.messages and trace.messages[-1].get("tool_calls"))


def grade_output(trace: Trace, text: str, finish_reason: str | None = None, tool_format: Any = None) -> ItemScore:
    """Grade one model reply to `trace` (see the module docstring); pure, no model involved.

    Args:
        trace: a trace ending with the gold assistant turn (BFCL traces carry meta "functions" and "ground_truth").
        text: the model's reply; finish_reason: "length" lets a call cut at its close tag count (as the gateway).
        tool_format: the harness format (name, dict or `ToolCallFormat`; None = default).
    """
    from evals.bfcl_match import match_calls
    from evals.bfcl_schema import decode_tool_calls, to_openai_tools
    from serving.tools.harness import parse_tool_calls

    fmt = _format(tool_format)
    gold = trace.messages[-1] if trace.messages else {}
    is_bfcl = _is_bfcl(trace)
    expects_call = _expects_call(trace)
    if trace.tools:
        out = parse_tool_calls(text, trace.tools, cut=finish_reason == "length", fmt=fmt)
        content, tool_calls = out.content, out.tool_calls
    else:  # the gateway parses nothing when no tools are offered
        content, tool_calls = text, []
    parsed = fmt.block_open not in (content or "")
    names = to_openai_tools(trace.meta["functions"])[1] if is_bfcl else {}
    try:
        calls = decode_tool_calls(tool_calls, names)
    except ValueError as exc:  # parse_tool_calls gives object arguments; kept as the BFCL suite grades it
        return ItemScore(trace.id, trace.category, text, (), False, False, f"unparsable calls: {exc}", expects_call, finish_reason)
    if is_bfcl:
        result = match_calls(calls, trace.meta["ground_truth"], trace.meta["functions"])
        correct, reason = result.ok, result.reason
    else:
        correct, reason = exact_match(calls, gold.get("tool_calls"))
    if not parsed and not reason:
        reason = "a call block does not parse"
    return ItemScore(trace.id, trace.category, text, tuple({"name": c.name, "arguments": c.arguments} for c in calls),
                     parsed, correct, reason, expects_call, finish_reason)


# --- the scorer ---------------------------------------------------------------------------------------------


class ToolCallScorer:
    """A local model loaded in our engine, ready to score traces.

    Args:
        model: a local registry name, a safetensors checkpoint folder (an export) or a .gguf file
            (`posttrain.local_models.local_model_spec`).
        tool_format: the harness format (a registered name, a dict of fields or a `ToolCallFormat`; None = default).
        max_tokens: reply budget per item (capped by the context left after the prompt).
        dtype: the engine's dtype ("float32" or "bfloat16").
        engine_config: `serving.engine.llm_engine.EngineConfig` (default: a 1 GiB KV cache, 32 sequences per batch).
    Raises:
        ModelNotLocalError: `model` is not local (before anything is loaded); PosttrainDataError: a bad format;
        serving errors of the load.
    """

    def __init__(self, model: str | Path, *, tool_format: Any = None, max_tokens: int = DEFAULT_MAX_TOKENS,
                 dtype: str = "float32", engine_config: Any = None, registry: Any = None):
        from posttrain.dataset import serving_tool_format
        from posttrain.local_models import local_model_spec
        from serving.engine.llm_engine import EngineConfig
        from serving.llm import LLM
        from serving.registry import ModelRegistry

        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.fmt = _format(tool_format)
        spec = local_model_spec(model, registry)
        self.model = str(model)
        self.max_tokens = max_tokens
        config = engine_config or EngineConfig(kv_cache_bytes=1 << 30, max_num_seqs=32, max_num_batched_tokens=2048)
        self.llm = LLM(spec.name, dtype=dtype, registry=ModelRegistry([spec]), engine_config=config)
        # as the gateway: a template that renders tools (Qwen2.5's) gets them, and fenced calls parse as calls
        self.fmt, self.native = serving_tool_format(self.llm.loaded.chat_format, self.fmt)

    def encode(self, trace: Trace) -> list[int]:
        """The prompt token ids of `trace`, as `plan_chat` builds them."""
        from posttrain.dataset import template_tools

        chat_format = self.llm.loaded.chat_format
        text = chat_format.render(prompt_messages(trace, self.fmt, self.native), tools=template_tools(trace, self.native))
        return self.llm.tokenizer.encode(text, add_special_tokens=chat_format.add_special_tokens)

    def score(self, traces: Sequence[Trace], *, progress: Callable[[str], None] | None = None) -> ScoreResult:
        """Generate a reply to every trace (one batched generate call) and grade it.

        Returns:
            ScoreResult with one ItemScore per trace, in order. A prompt that leaves no room to answer within the
            context is graded wrong with that reason, without generating.
        Raises:
            PosttrainDataError: no traces, or a trace without a final assistant turn (before generating).
        """
        from serving.sampling.params import SamplingParams

        if not traces:
            raise PosttrainDataError("no traces to score")
        started = time.perf_counter()
        chat_format = self.llm.loaded.chat_format
        context = self.llm.loaded.context_length
        prompts = [self.encode(t) for t in traces]
        runnable = [k for k, ids in enumerate(prompts) if len(ids) < context]
        params = [chat_format.reply_params(SamplingParams(temperature=0.0, max_tokens=min(self.max_tokens, context - len(prompts[k]))))
                  for k in runnable]
        if progress:
            progress(f"generating {len(runnable)} replies with {self.model} ...")
        t0 = time.perf_counter()
        outputs = self.llm.generate([{"prompt_token_ids": prompts[k]} for k in runnable], params) if runnable else []
        generate_s = time.perf_counter() - t0
        by_index = dict(zip(runnable, outputs))
        items = []
        for k, trace in enumerate(traces):
            if k not in by_index:
                items.append(ItemScore(trace.id, trace.category, "", (), True, False,
                                       f"the prompt ({len(prompts[k])} tokens) fills the {context}-token context",
                                       _expects_call(trace), None, len(prompts[k]), 0))
                continue
            out = by_index[k].outputs[0]
            graded = grade_output(trace, out.text, out.finish_reason, self.fmt)
            items.append(dataclasses.replace(graded, prompt_tokens=len(prompts[k]), output_tokens=len(out.token_ids)))
        return ScoreResult(self.model, tuple(items), self.fmt.name, self.max_tokens, time.perf_counter() - started, generate_s)
