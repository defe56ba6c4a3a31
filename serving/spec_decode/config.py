"""`SpeculativeConfig`: the settings of speculative decoding (`EngineConfig.speculative`; None = off)."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine drafts and how many tokens it drafts.

    Attributes:
        method: "ngram" (prompt lookup: continue an earlier occurrence of the last n tokens, no second
            model) or "draft" (a smaller model of the same tokenizer drafts greedily).
        draft_model: registry name of the draft model when method == "draft".
        num_speculative_tokens: k_max, the most tokens drafted for a sequence per step.
        min_speculative_tokens: k_min, the fewest drafted when a draft is made (adaptive lookahead).
        adaptive: per-request k from its acceptance rate and engine-wide backoff with the number of
            running sequences (`serving.spec_decode.policy`); False drafts k_max whenever a draft exists,
            below `disable_by_batch_size` running sequences.
        step_cost: with `adaptive`, draft only in steps whose measured cost the expected accepted drafts
            repay (`serving.spec_decode.step_cost`). On by default: without it, bursts of non-repetitive
            requests ran at 0.80x the speed of no speculation (8 requests; drafts resume in the burst's
            tail, below the batch threshold, and are mostly rejected); with it, its calibration, the
            engine-wide prior of new requests and probe backoff, the worst burst size was 0.93x and the
            geometric mean 0.99x, the repetitive workload 1.64x (`benchmarks/bench_spec_decode.py
            --repeats 5`, SmolLM2 on a 2-core Xeon).
            Its timings are the engine's own steps, so on a noisy shared CPU they can switch speculation
            off where it would pay; a probe step every 32 decisions corrects that.
        ngram_max, ngram_min: the n-gram lengths tried, longest first.
        disable_by_batch_size: no speculation in a step that starts with this many running sequences or
            more (vLLM's `speculative_disable_by_batch_size`); 1 never speculates. A verify step with
            drafts leaves the batched decode attention and the compiled decode step for a per-sequence
            attention call per drafted sequence, a cost that grows with the batch.
        ema_alpha: weight of the newest step in the per-request acceptance-rate moving average, in (0, 1].

    Raises:
        ValueError: naming the field to fix.
    """

    method: str = "ngram"
    draft_model: str | None = None
    num_speculative_tokens: int = 5
    min_speculative_tokens: int = 1
    adaptive: bool = True
    ngram_max: int = 4
    ngram_min: int = 1
    disable_by_batch_size: int = 4
    step_cost: bool = True
    ema_alpha: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model: a registry name (see `link models`)")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 1 <= self.min_speculative_tokens <= self.num_speculative_tokens:
            raise ValueError(f"min_speculative_tokens must be in [1, num_speculative_tokens={self.num_speculative_tokens}], "
                             f"got {self.min_speculative_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got ngram_min={self.ngram_min}, ngram_max={self.ngram_max}")
        if self.disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1], got {self.ema_alpha}")
