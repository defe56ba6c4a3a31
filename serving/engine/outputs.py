"""Generation results, shaped like vLLM's `RequestOutput` / `CompletionOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """Log-probability (natural log) of one token under the raw model distribution."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One generated sequence.

    Attributes:
        index: which of the request's `n` samples this is.
        text: the generated text, without the matched stop string (unless asked) or EOS.
        token_ids: every generated token id, including the one that ended generation.
        finish_reason: "stop" (EOS, stop token or stop string), "length" (max_tokens or context full) or
            "abort" (the engine stopped the request: `RequestOutput.error` says why).
        stop_reason: the stop string or stop token id that matched; None for EOS or length.
        logprobs: per generated token, {token id: Logprob} holding the chosen token and the top-k.
        cumulative_logprob: sum of the chosen tokens' logprobs (when logprobs were requested).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


@dataclass
class SpeculativeStats:
    """Speculative decoding of one request (all its samples), when the engine speculates.

    Attributes:
        num_draft_tokens: tokens drafted and verified.
        num_accepted_tokens: of those, kept (OpenAI `completion_tokens_details.accepted_prediction_tokens`).
        num_draft_steps: verification steps that carried drafts.
    """

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_draft_steps: int = 0

    @property
    def num_rejected_tokens(self) -> int:
        return self.num_draft_tokens - self.num_accepted_tokens

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted, None before any draft."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_draft_length(self) -> float | None:
        """drafted tokens per verification step, None before any."""
        return self.num_draft_tokens / self.num_draft_steps if self.num_draft_steps else None


@dataclass
class RequestOutput:
    """The result of one prompt: its tokens and its `n` completions, plus timing in seconds, its
    speculative decoding counts when the engine speculates (else None), and the error that stopped it
    (`serving.errors.SamplingTimeoutError`; else None)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: dict[str, float] = field(default_factory=dict)
    speculative: SpeculativeStats | None = None
    error: Exception | None = None
