"""OpenAI request -> engine requests, and engine outputs -> OpenAI responses (whole or streamed).

Streaming holds back the last (longest stop string - 1) characters until the sequence finishes, so text
that later turns out to start a stop string is never sent; a trailing U+FFFD (half of a multi-byte
character) is held back too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from protocol.errors import ValidationProblem
from protocol.openai import ChatCompletionRequest, CompletionRequest, usage
from serving.engine.outputs import RequestOutput
from serving.frontend.chat_tools import ToolStream, prepare_chat, tool_message
from serving.frontend.logprobs import TextOffsets, chat_logprobs, completion_logprobs
from serving.model_loader import LoadedModel
from serving.sampling.params import SamplingParams
from serving.tools.formats import DEFAULT_FORMAT, ToolCallFormat
from serving.tools.harness import native_tool_format


@dataclass
class RequestPlan:
    """What to run for one HTTP request and how to shape the answer."""

    kind: str  # "chat" or "completion"
    model: str
    params: SamplingParams
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    stream: bool
    include_usage: bool
    top_logprobs: int | None
    echo: bool = False
    tools: list[dict] | None = None  # chat: the offered tools whose calls are parsed from the output
    parallel_tool_calls: bool = True
    forced_tool_calls: bool = False  # chat: the output is calls forced by tool_choice (content always null)
    tool_format: ToolCallFormat = DEFAULT_FORMAT  # chat: the harness format the calls are parsed in
    response_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.response_id


def _sampling(body, max_tokens: int, stop: tuple[str, ...], logprobs: int | None) -> SamplingParams:
    return SamplingParams(
        n=body.n, temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0, min_p=body.min_p or 0.0,
        seed=body.seed, presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty or 1.0, stop=stop, stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos, max_tokens=max_tokens, logprobs=logprobs, min_tokens=body.min_tokens,
        logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
    )


def _stops(body) -> tuple[str, ...]:
    if body.stop is None:
        return ()
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if len(stops) > 4:
        raise ValidationProblem("stop takes at most 4 sequences", param="stop")
    return tuple(s for s in stops if s)


def _max_tokens(requested: int | None, prompt_lens: list[int], ctx: int, default: int | None, *,
                prompt_param: str, budget_param: str) -> int:
    """The output budget of a request: `requested`, else `default`, else what the context leaves.

    Raises:
        ValidationProblem: 400 `context_length_exceeded` naming `prompt_param` ("messages" or "prompt") when the
            prompt fills the context, or `budget_param` ("max_tokens" / "max_completion_tokens") when prompt plus
            the requested output do not fit.
    """
    longest = max(prompt_lens)
    if longest >= ctx:
        raise ValidationProblem(f"This model's maximum context length is {ctx} tokens. However, your prompt "
                                f"(`{prompt_param}`) has {longest} tokens, which leaves no room to generate; shorten it.",
                                param=prompt_param, code="context_length_exceeded")
    wanted = requested if requested is not None else default
    if wanted is None:
        return ctx - longest
    if longest + wanted > ctx:
        raise ValidationProblem(
            f"This model's maximum context length is {ctx} tokens. However, you requested {longest + wanted} tokens "
            f"({longest} in the prompt, {wanted} for the completion). Reduce `{budget_param}` to at most "
            f"{ctx - longest} or shorten the prompt.", param=budget_param, code="context_length_exceeded")
    return wanted


def plan_chat(body: ChatCompletionRequest, lm: LoadedModel, max_model_len: int,
              tool_format: ToolCallFormat = DEFAULT_FORMAT) -> RequestPlan:
    """Validate a chat request and render its messages with the model's chat format (tools in `tool_format`).

    Raises:
        ValidationProblem: a field the model cannot serve, or a prompt that does not fit (see `_max_tokens`).
    """
    fmt = lm.chat_format
    # A template that renders tools (Qwen2.5's) gets them, when the harness format is its own call syntax.
    native_format = native_tool_format(fmt, tool_format)
    native = native_format is not None
    tool_format = native_format or tool_format
    setup = prepare_chat(body, tool_format, native)  # unservable fields refused; tools rendered; response_format schema
    if body.top_logprobs is not None and not body.logprobs:
        raise ValidationProblem("top_logprobs requires logprobs to be true", param="top_logprobs")
    # continue_final_message (vLLM's): the prompt ends inside the assistant's partial reply, which the output extends
    prompt = fmt.render(setup.messages, tools=setup.template_tools, add_generation_prompt=body.add_generation_prompt,
                        continue_final_message=body.continue_final_message)
    ids = lm.tokenizer.encode(prompt, add_special_tokens=fmt.add_special_tokens)
    budget_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = _max_tokens(getattr(body, budget_param), [len(ids)], max_model_len, None,
                             prompt_param="messages", budget_param=budget_param)
    top = (body.top_logprobs or 0) if body.logprobs else None
    stops = _stops(body)
    # after a tool result: an echoed result block is skipped before the answer, and stops the output after it
    params = dataclasses.replace(_sampling(body, max_tokens, stops, top), guided_json=setup.guided_json,
                                 structural_tag=setup.structural_tag, echo_markers=setup.echo_markers)
    # the format's turn markers as stop strings, after the client's; its reply's opening space (not a continuation's)
    params = fmt.reply_params(params, continuing=body.continue_final_message)
    return RequestPlan("chat", body.model, params, [ids], [prompt], body.stream,
                       bool(body.stream_options and body.stream_options.include_usage), top,
                       tools=setup.tools, parallel_tool_calls=setup.parallel, forced_tool_calls=setup.forced,
                       tool_format=setup.tool_format)


def plan_completion(body: CompletionRequest, lm: LoadedModel, max_model_len: int) -> RequestPlan:
    """Validate a completion request; its prompt may be text, ids, or a list of either."""
    if body.suffix:
        raise ValidationProblem("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise ValidationProblem(f"best_of (here {body.best_of}) is not supported for this model unless it equals n "
                                f"({body.n}); request n samples and pick the best yourself", param="best_of")
    p = body.prompt
    if isinstance(p, str):
        texts, prompts = [p], [lm.tokenizer.encode(p)]
    elif p and all(isinstance(x, int) for x in p):
        texts, prompts = [None], [list(p)]
    elif p and all(isinstance(x, str) for x in p):
        texts, prompts = list(p), [lm.tokenizer.encode(x) for x in p]
    elif p and all(isinstance(x, list) for x in p):
        texts, prompts = [None] * len(p), [list(x) for x in p]
    else:
        raise ValidationProblem("prompt must be a string, a list of strings, a list of token ids, or a list of such lists", param="prompt")
    vocab = lm.config.vocab_size
    for ids in prompts:
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValidationProblem(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", param="prompt")
    if texts[0] is None:
        texts = [lm.tokenizer.decode(ids, skip_special_tokens=False) for ids in prompts]
    max_tokens = _max_tokens(body.max_tokens, [len(x) for x in prompts], max_model_len, 16,
                             prompt_param="prompt", budget_param="max_tokens")
    return RequestPlan("completion", body.model, _sampling(body, max_tokens, _stops(body), body.logprobs), prompts, texts,
                       body.stream, bool(body.stream_options and body.stream_options.include_usage), body.logprobs, echo=body.echo)


def _choice(plan: RequestPlan, state, prompt_index: int, completion, text: str, token_ids, entries, finish) -> dict:
    index = prompt_index * plan.params.n + completion.index
    if plan.kind == "chat":
        logprobs = chat_logprobs(token_ids, entries, state.loaded.tokenizer, plan.top_logprobs) if entries is not None else None
        message, finish = tool_message(text, finish, plan.tools, plan.parallel_tool_calls, plan.forced_tool_calls, plan.tool_format)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
    prefix = plan.prompt_texts[prompt_index] if plan.echo else ""
    logprobs = None
    if entries is not None:
        tokenizer = state.loaded.tokenizer
        offsets = TextOffsets(tokenizer, plan.params.skip_special_tokens, len(prefix)).extend(token_ids)
        logprobs = completion_logprobs(token_ids, entries, tokenizer, plan.top_logprobs, offsets)
    return {"index": index, "text": prefix + text, "logprobs": logprobs, "finish_reason": finish}


async def _last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    last = None
    async for output in stream:
        last = output
    return last


async def whole_response(plan: RequestPlan, streams: list[AsyncIterator[RequestOutput]], state) -> dict:
    """Run every prompt to completion and build the OpenAI response object."""
    start = time.monotonic()
    finals = await asyncio.gather(*(_last(s) for s in streams))
    choices, completion_tokens = [], 0
    for i, final in enumerate(finals):
        state.metrics.observe_finished(final, time.monotonic() - start)
        for c in final.outputs:
            completion_tokens += len(c.token_ids)
            choices.append(_choice(plan, state, i, c, c.text, c.token_ids, c.logprobs, c.finish_reason))
    choices.sort(key=lambda c: c["index"])
    prompt_tokens = sum(len(p) for p in plan.prompts)
    return {"id": plan.id, "object": plan.object_name, "created": plan.created, "model": plan.model,
            "choices": choices, "usage": usage(prompt_tokens, completion_tokens, [f.speculative for f in finals])}


async def _merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several output streams, tagging each item with its stream's index."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        try:
            async for item in stream:
                await queue.put((i, item))
        except BaseException as exc:  # surfaced to the consumer below
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()


async def stream_events(plan: RequestPlan, streams: list[AsyncIterator[RequestOutput]], state) -> AsyncIterator[dict]:
    """The SSE payloads (without framing) of a streamed response."""
    chunk_object = "chat.completion.chunk" if plan.kind == "chat" else "text_completion"
    holdback = max((len(s) for s in plan.params.stop), default=1) - 1
    sent_text: dict[int, int] = {}
    sent_tokens: dict[int, int] = {}
    text_offsets: dict[int, TextOffsets] = {}  # completions logprobs: per choice, offsets of the tokens sent
    start = time.monotonic()
    completion_tokens = 0
    speculative = []  # SpeculativeStats of each finished prompt (None without speculation)
    tool_stream = ToolStream(plan.tools, plan.parallel_tool_calls, plan.forced_tool_calls, plan.tool_format) if plan.tools is not None else None

    def chunk(choices: list[dict]) -> dict:
        body = {"id": plan.id, "object": chunk_object, "created": plan.created, "model": plan.model, "choices": choices}
        if plan.include_usage:
            body["usage"] = None
        return body

    if plan.kind == "chat":
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                     for i in range(len(plan.prompts) * plan.params.n)])
    async for prompt_index, output in _merge(streams):
        choices, tool_chunks = [], []
        for c in output.outputs:
            index = prompt_index * plan.params.n + c.index
            done_text, done_tokens = sent_text.get(index, 0), sent_tokens.get(index, 0)
            if done_text == -1:
                continue  # this choice already sent its final chunk
            safe = len(c.text) if c.finish_reason else max(done_text, len(c.text) - holdback)
            while not c.finish_reason and safe > done_text and c.text[safe - 1] == "\ufffd":
                safe -= 1
            if tool_stream is not None and not c.finish_reason:
                safe = min(safe, tool_stream.safe_length(c.text, done_text))
            delta = c.text[done_text:safe]
            new_ids = c.token_ids[done_tokens:]
            if not delta and not c.finish_reason:
                continue
            entries = c.logprobs[done_tokens:] if c.logprobs is not None else None
            if plan.kind == "chat":
                logprobs = chat_logprobs(new_ids, entries, state.loaded.tokenizer, plan.top_logprobs) if entries is not None else None
                if tool_stream is not None and c.finish_reason:  # the rest of the content, then the calls
                    deltas, finish = tool_stream.final_deltas(c.text, done_text, c.finish_reason)
                    tool_chunks += [{"index": index, "delta": d, "logprobs": logprobs if i == 0 else None, "finish_reason": None}
                                    for i, d in enumerate(deltas[:-1])]
                    choices.append({"index": index, "delta": deltas[-1], "logprobs": logprobs if len(deltas) == 1 else None,
                                    "finish_reason": finish})
                else:
                    choices.append({"index": index, "delta": {"content": delta} if delta else {}, "logprobs": logprobs, "finish_reason": c.finish_reason})
            else:
                prefix = plan.prompt_texts[prompt_index] if plan.echo and done_tokens == 0 else ""
                logprobs = None
                if entries is not None:
                    if index not in text_offsets:
                        start = len(plan.prompt_texts[prompt_index]) if plan.echo else 0
                        text_offsets[index] = TextOffsets(state.loaded.tokenizer, plan.params.skip_special_tokens, start)
                    offsets = text_offsets[index].extend(c.token_ids)
                    logprobs = completion_logprobs(new_ids, entries, state.loaded.tokenizer, plan.top_logprobs, offsets)
                choices.append({"index": index, "text": prefix + delta, "logprobs": logprobs, "finish_reason": c.finish_reason})
            sent_tokens[index] = len(c.token_ids)
            sent_text[index] = -1 if c.finish_reason else safe
            if c.finish_reason:
                completion_tokens += len(c.token_ids)
        if output.finished:
            state.metrics.observe_finished(output, time.monotonic() - start)
            speculative.append(output.speculative)
        for tool_chunk in tool_chunks:
            yield chunk([tool_chunk])
        if choices:
            yield chunk(choices)
    if plan.include_usage:
        yield {"id": plan.id, "object": chunk_object, "created": plan.created, "model": plan.model, "choices": [],
               "usage": usage(sum(len(p) for p in plan.prompts), completion_tokens, speculative)}
