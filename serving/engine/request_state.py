"""The engine's records of a request in flight: `RequestState` (a prompt, its n sequences, timing) and
`SeqState` (one sequence's sampler, detokenizer, visible text, logprobs, stop state, speculation record),
and `RequestState.snapshot`, the `RequestOutput` a step returns for it (with the error, when the engine
stopped the request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.engine.outputs import CompletionOutput, Logprob, RequestOutput
from serving.engine.sequence import Sequence
from serving.errors import ServingError
from serving.sampling.params import SamplingParams
from serving.sampling.sampler import Sampler
from serving.spec_decode.policy import AcceptanceState, summarize
from serving.text.detokenizer import IncrementalDetokenizer


@dataclass
class SeqState:
    """Per-sequence output state kept by the engine."""

    index: int
    sampler: Sampler
    detokenizer: IncrementalDetokenizer
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    guide: object | None = None  # serving.guided.decoding.JsonGuide for guided_json / structural_tag
    spec: AcceptanceState | None = None  # speculative decoding record; None = this sequence never drafts


@dataclass
class RequestState:
    """A request and its sequences (one, then `params.n` after the fork), keyed by `Sequence.seq_id`;
    times from `time.monotonic()` in seconds."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)
    states: dict[int, SeqState] = field(default_factory=dict)
    first_scheduled_time: float | None = None
    last_token_time: float | None = None
    error: ServingError | None = None  # set when the engine stopped the request (`LLMEngine._stop`)

    @property
    def finished(self) -> bool:
        if self.error is not None:
            return True
        return len(self.seqs) == self.params.n and all(st.finish_reason for st in self.states.values())

    def snapshot(self, is_speculative: bool) -> RequestOutput:
        """The request's output so far: completions by index, timing metrics (queue, TTFT, ITL in
        seconds) and, when the engine speculates (`is_speculative`), the summed speculation counts."""
        completions = []
        for seq in self.seqs:
            st = self.states[seq.seq_id]
            completions.append(CompletionOutput(
                index=st.index, text=st.text, token_ids=list(seq.output_token_ids), finish_reason=st.finish_reason,
                stop_reason=st.stop_reason, logprobs=None if st.logprobs is None else list(st.logprobs),
                cumulative_logprob=st.cumulative_logprob if st.logprobs is not None else None,
            ))
        completions.sort(key=lambda c: c.index)
        metrics = {"arrival_time": self.arrival_time, "num_output_tokens": sum(len(c.token_ids) for c in completions)}
        if self.first_scheduled_time is not None:
            metrics["queue_seconds"] = self.first_scheduled_time - self.arrival_time
        first = min((st.first_token_time for st in self.states.values() if st.first_token_time), default=None)
        if first is not None:
            metrics["ttft_seconds"] = first - self.arrival_time
            num_steps = max(len(c.token_ids) for c in completions) - 1
            if num_steps > 0:
                metrics["itl_seconds"] = (self.last_token_time - first) / num_steps
        spec = summarize(st.spec for st in self.states.values() if st.spec is not None) if is_speculative else None
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions, self.finished, metrics, spec,
                             self.error)
