"""Mixture-of-Agents: several proposers answer, an aggregator writes the final answer from theirs.

    moa = MixtureOfAgents([Proposer("smollm2-135m-instruct"), Proposer("gemma-3-270m")],
                          aggregator="smollm2-135m-instruct", layers=1, deadline_s=60)
    trace = MoATrace()
    response = await moa.complete(caller, body, trace)        # a whole OpenAI answer (the aggregator's)
    async for chunk in moa.stream(caller, body, trace): ...   # the aggregator's chunks, after the proposers
    trace.to_dict()                                           # every proposal (text or error), for the request log

Method (Wang et al. 2024, "Mixture-of-Agents Enhances Large Language Model Capabilities", arXiv:2406.04692):
layer 1's proposers answer the request independently; each later layer's proposers answer it again with the
previous layer's answers shown as references; the aggregator answers it with the last layer's answers as
references, under a synthesis instruction (ours below, not the paper's wording). Proposers may be several
models, or one model sampled at several temperatures (`MixtureOfAgents.sampled`).

Failure and latency: a layer's proposers run concurrently, each under `deadline_s` seconds from the start of
its layer; one that raises or misses its deadline is dropped (the trace keeps its error) and the layer goes on
with the rest. A layer left with fewer than `min_proposals` answers raises `NoProposalError`. The aggregator's
own failure propagates (it is the answer). Only the aggregator's answer is returned or streamed.

Proposer calls carry the client's request minus its delivery fields (`n`, `stream`, `logprobs`, ...) and its
output constraints (`tools`, `tool_choice`, `response_format`): proposers write prose for the aggregator,
which gets the client's request whole (tools and format included) plus the references.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from routers.calls import ModelCaller, is_chat, response_text, usage_tokens, without_delivery

# Our synthesis instruction. The paper's (Table 1 of arXiv:2406.04692) asks the aggregator to critically
# evaluate the responses and synthesize one refined answer; this says the same in our own words.
SYNTHESIS_PROMPT = (
    "Other assistants have already answered the user's latest request; their answers are listed below. "
    "Some may be wrong, incomplete or in disagreement. Write the single best reply yourself: check each "
    "answer's claims and reasoning, keep what is correct, repair or leave out what is not, and combine the "
    "strongest parts. Reply to the user directly, in the format the request asks for, without mentioning "
    "the other answers or these instructions."
)
# Fields a proposer never gets (see the module docstring); `without_delivery` drops the delivery ones.
PROPOSER_DROPPED = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "functions", "function_call")
# Fields the aggregator call never gets from the client's body: the caller streams or not as asked of it.
AGGREGATOR_DROPPED = ("model", "stream", "stream_options")


class NoProposalError(RuntimeError):
    """Fewer proposers than required answered in one layer (each failed or missed its deadline).

    Attributes:
        layer: the layer (1-based) that came up short.
        proposals: that layer's proposals, each with its error.
    """

    def __init__(self, layer: int, proposals: list[Proposal], required: int):
        errors = "; ".join(f"{p.model}: {p.error}" for p in proposals if p.error)
        super().__init__(f"mixture-of-agents layer {layer}: {sum(p.is_ok for p in proposals)} of {len(proposals)} "
                         f"proposers answered, {required} needed ({errors})")
        self.layer, self.proposals = layer, proposals


@dataclass(frozen=True)
class Proposer:
    """One proposer: a public model name and the temperature it samples at (None: the request's own)."""

    model: str
    temperature: float | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("a proposer needs a model name")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError(f"proposer temperature must be in [0, 2], got {self.temperature}")


@dataclass
class Proposal:
    """One proposer's outcome in one layer.

    Attributes:
        layer: 1-based layer; index: the proposer's position in the layer.
        text: the answer (None when dropped); error: why it was dropped (None when it answered).
        latency_s: seconds from the layer's start to the answer or the failure.
        prompt_tokens, completion_tokens: the call's usage (0 when unknown).
    """

    layer: int
    index: int
    model: str
    temperature: float | None
    text: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    exception: BaseException | None = field(default=None, repr=False, compare=False)  # the failed call's, if any

    @property
    def is_ok(self) -> bool:
        return self.error is None and self.text is not None

    def to_dict(self) -> dict[str, Any]:
        entry = {"layer": self.layer, "index": self.index, "model": self.model, "temperature": self.temperature,
                 "ok": self.is_ok, "latency_ms": round(self.latency_s * 1000, 1),
                 "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        entry.update({"text": self.text} if self.is_ok else {"error": self.error})
        return entry


@dataclass
class MoATrace:
    """What one Mixture-of-Agents run did, filled in as it runs (JSON via `to_dict`)."""

    proposals: list[Proposal] = field(default_factory=list)
    aggregator: str = ""
    proposers_s: float | None = None  # seconds until the last layer's proposals were in

    def to_dict(self) -> dict[str, Any]:
        return {"aggregator": self.aggregator, "proposals": [p.to_dict() for p in self.proposals],
                "num_dropped": sum(not p.is_ok for p in self.proposals),
                "proposers_ms": None if self.proposers_s is None else round(self.proposers_s * 1000, 1)}


def with_references(body: dict[str, Any], answers: Sequence[str], instruction: str = SYNTHESIS_PROMPT) -> dict[str, Any]:
    """`body` with the synthesis instruction and the numbered `answers` added.

    Chat: appended to the system message (one is inserted first when there is none), as the paper's reference
    implementation does. Completion: put before the prompt (each prompt of a list).
    """
    block = instruction + "".join(f"\n\nAnswer {i}:\n{text.strip()}" for i, text in enumerate(answers, 1))
    if is_chat(body):
        messages = list(body.get("messages") or [])
        if messages and messages[0].get("role") in ("system", "developer") and isinstance(messages[0].get("content"), str):
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
        else:
            messages.insert(0, {"role": "system", "content": block})
        return {**body, "messages": messages}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return {**body, "prompt": [f"{block}\n\n{p}" for p in prompt]}
    return {**body, "prompt": f"{block}\n\n{prompt or ''}"}


class MixtureOfAgents:
    """Proposers in `layers` layers, then an aggregator (see the module docstring).

    Args:
        proposers: one layer's proposers (Proposer or a model name), used in every layer; at least one.
        aggregator: the public model name that writes the final answer.
        layers: proposer layers (1 = the classic proposers-then-aggregator; the paper's best used 3).
        deadline_s: seconds each proposer has from the start of its layer.
        proposer_max_tokens: the most tokens a proposer writes (the request's `max_tokens` when smaller;
            None: the request's own).
        min_proposals: answers a layer needs to go on (1: only all of them failing is an error).
        synthesis_prompt: the aggregator's (and later layers') instruction.
    Raises:
        ValueError: no proposers, layers < 1, deadline_s <= 0, min_proposals outside [1, len(proposers)].
    """

    def __init__(self, proposers: Sequence[Proposer | str], aggregator: str, *, layers: int = 1, deadline_s: float = 60.0,
                 proposer_max_tokens: int | None = 512, min_proposals: int = 1, synthesis_prompt: str = SYNTHESIS_PROMPT):
        self.proposers = [p if isinstance(p, Proposer) else Proposer(p) for p in proposers]
        if not self.proposers:
            raise ValueError("a mixture of agents needs at least one proposer")
        if not aggregator:
            raise ValueError("a mixture of agents needs an aggregator model")
        if layers < 1 or deadline_s <= 0:
            raise ValueError(f"layers must be >= 1 and deadline_s > 0, got layers={layers}, deadline_s={deadline_s}")
        if not 1 <= min_proposals <= len(self.proposers):
            raise ValueError(f"min_proposals must be in [1, {len(self.proposers)}], got {min_proposals}")
        if proposer_max_tokens is not None and proposer_max_tokens < 1:
            raise ValueError(f"proposer_max_tokens must be >= 1, got {proposer_max_tokens}")
        self.aggregator, self.layers, self.deadline_s = aggregator, layers, deadline_s
        self.proposer_max_tokens, self.min_proposals, self.synthesis_prompt = proposer_max_tokens, min_proposals, synthesis_prompt

    @classmethod
    def sampled(cls, model: str, temperatures: Sequence[float], aggregator: str | None = None, **options: Any) -> MixtureOfAgents:
        """One model proposing at each of `temperatures` (aggregated by `aggregator`, default the same model)."""
        return cls([Proposer(model, t) for t in temperatures], aggregator or model, **options)

    @property
    def models(self) -> list[str]:
        """Every model this mixture calls, each once: the aggregator first, then the proposers in order."""
        return list(dict.fromkeys([self.aggregator, *(p.model for p in self.proposers)]))

    def proposer_body(self, body: dict[str, Any], proposer: Proposer, index: int, references: Sequence[str]) -> dict[str, Any]:
        """The request one proposer gets (see the module docstring); layers after the first add `references`."""
        sent = {k: v for k, v in without_delivery(body).items() if k not in PROPOSER_DROPPED}
        if proposer.temperature is not None:
            sent["temperature"] = proposer.temperature
        if sent.get("seed") is not None:  # equal seeds would make one model's samples at one temperature identical
            sent["seed"] = int(sent["seed"]) + index
        asked = sent.pop("max_completion_tokens", None) or sent.get("max_tokens")
        limits = [t for t in (asked, self.proposer_max_tokens) if t is not None]
        if limits:
            sent["max_tokens"] = min(limits)
        return with_references(sent, references, self.synthesis_prompt) if references else sent

    def aggregator_body(self, body: dict[str, Any], answers: Sequence[str]) -> dict[str, Any]:
        """The aggregator's request: the client's (minus model and stream fields) with `answers` as references."""
        return with_references({k: v for k, v in body.items() if k not in AGGREGATOR_DROPPED}, answers, self.synthesis_prompt)

    async def _propose(self, caller: ModelCaller, body: dict[str, Any], layer: int, index: int, proposer: Proposer,
                       started: float) -> Proposal:
        proposal = Proposal(layer, index, proposer.model, proposer.temperature)
        deadline = asyncio.timeout(self.deadline_s)
        try:
            async with deadline:
                response = await caller.complete(proposer.model, body)
            proposal.prompt_tokens, proposal.completion_tokens = usage_tokens(response.get("usage"))
            text = response_text(response)
            if text.strip():
                proposal.text = text
            else:
                proposal.error = "empty answer"
        except TimeoutError as exc:
            proposal.error = f"missed its deadline of {self.deadline_s:g} s" if deadline.expired() else f"TimeoutError: {exc}"
        except Exception as exc:  # noqa: BLE001 - any failure of one proposer drops it (the module docstring)
            proposal.error, proposal.exception = f"{type(exc).__name__}: {exc}", exc
        proposal.latency_s = time.monotonic() - started
        return proposal

    async def propose(self, caller: ModelCaller, body: dict[str, Any], trace: MoATrace | None = None) -> list[str]:
        """Run every proposer layer; the last layer's answers, in proposer order.

        Raises:
            NoProposalError: a layer got fewer than `min_proposals` answers.
        """
        trace = trace if trace is not None else MoATrace()
        started = time.monotonic()
        references: list[str] = []
        for layer in range(1, self.layers + 1):
            layer_start = time.monotonic()
            proposals = await asyncio.gather(*(
                self._propose(caller, self.proposer_body(body, p, i, references), layer, i, p, layer_start)
                for i, p in enumerate(self.proposers)))
            trace.proposals.extend(proposals)
            answered = [p for p in proposals if p.is_ok]
            if len(answered) < self.min_proposals:
                raise NoProposalError(layer, list(proposals), self.min_proposals)
            references = [p.text for p in answered]
        trace.proposers_s = time.monotonic() - started
        return references

    async def complete(self, caller: ModelCaller, body: dict[str, Any], trace: MoATrace | None = None) -> dict[str, Any]:
        """The aggregator's whole answer. Raises NoProposalError, or whatever the aggregator call raises."""
        trace = trace if trace is not None else MoATrace()
        trace.aggregator = self.aggregator
        answers = await self.propose(caller, body, trace)
        return await caller.complete(self.aggregator, self.aggregator_body(body, answers))

    async def stream(self, caller: ModelCaller, body: dict[str, Any], trace: MoATrace | None = None) -> AsyncIterator[dict[str, Any]]:
        """The aggregator's chunks, once every proposer layer is done. Raises as `complete` (while iterating)."""
        trace = trace if trace is not None else MoATrace()
        trace.aggregator = self.aggregator
        answers = await self.propose(caller, body, trace)
        chunks = caller.stream(self.aggregator, self.aggregator_body(body, answers))
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
