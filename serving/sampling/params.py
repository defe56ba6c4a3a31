"""Per-request sampling parameters, after the OpenAI completions API and vLLM's `SamplingParams`.

A `SamplingParams` is immutable and validated on construction: every out-of-range field raises
`serving.errors.InvalidSamplingParamsError` with a message that names the field, the value received
and the valid range (for example ``"max_tokens must be at least 1, got 0"``), so the gateway can
return it verbatim as an OpenAI-style 400 error.

Which layer consumes which field:

* `serving.sampling.sampler` (per decoding step): `temperature`, `top_p`, `top_k`, `min_p`, `seed`,
  `presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logprobs`, `logit_bias`,
  `min_tokens` (with `stop_token_ids` and the model's EOS ids).
* The engine / scheduler: `n`, `max_tokens`, `min_tokens`, `stop_token_ids`, `ignore_eos`.
* The detokenizer / output processor: `stop`, `include_stop_str_in_output`, `skip_special_tokens`,
  `strip_leading_space`.
* Guided decoding (`serving.guided.decoding`): `guided_json`, `structural_tag`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from protocol.openai import MAX_LOGIT_BIAS, SEED_MAX, SEED_MIN
from serving.errors import InvalidSamplingParamsError

# vLLM's default cap on `logprobs` (`max_logprobs`), also the OpenAI chat API's `top_logprobs` cap.
MAX_LOGPROBS = 20


class SamplingType(enum.IntEnum):
    """How the next token is chosen (mirrors vLLM's `SamplingType`)."""

    GREEDY = 0
    """Argmax of the (penalized) logits; deterministic, no random numbers drawn."""
    RANDOM = 1
    """A random draw from a generator seeded from the global torch RNG when the sampler is built."""
    RANDOM_SEED = 2
    """A random draw from a generator seeded with the request's `seed` (reproducible)."""


def _fail(name: str, value: Any, expected: str) -> InvalidSamplingParamsError:
    return InvalidSamplingParamsError(f"{name} must be {expected}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_float(name: str, value: Any, ok: bool, expected: str) -> None:
    """Raise unless `value` is a real, non-NaN number and `ok` holds."""
    if not _is_number(value) or math.isnan(value) or not ok:
        raise _fail(name, value, expected)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters for one request (immutable, validated on construction).

    Attributes:
        n: Number of completions to return for the prompt (OpenAI `n`). Integer, >= 1. Consumed by
            the engine, which forks the request into `n` sequences; the sampler itself draws one
            token for one sequence.
        temperature: Softmax temperature, a dimensionless divisor of the logits. >= 0. Values < 1
            sharpen the distribution, values > 1 flatten it; 0 means greedy decoding (argmax).
            OpenAI allows [0, 2]; like vLLM we accept any non-negative value.
        top_p: Nucleus sampling (Holtzman et al. 2019, arXiv:1904.09751): keep the smallest set of
            most likely tokens whose probability mass is >= `top_p`. In (0, 1]; 1 disables it.
        top_k: Keep only the `top_k` most likely tokens (vLLM extension; not in the OpenAI API).
            Integer >= -1; 0 or -1 disables it. `top_k == 1` is greedy decoding.
        min_p: Min-p sampling (Nguyen et al. 2024, arXiv:2407.01082): drop tokens whose probability
            is below `min_p` times the probability of the most likely token. In [0, 1]; 0 disables
            it (vLLM extension).
        seed: Seed of this request's private random generator, a signed 64-bit integer, or None.
            With a seed the same request gives the same tokens regardless of other requests or
            the global torch RNG (OpenAI `seed`, best-effort determinism).
        presence_penalty: Subtracted once from the logit of every token that already occurs in the
            generated output (OpenAI `presence_penalty`), in logit units. In [-2, 2]; positive
            values encourage new tokens. 0 disables it.
        frequency_penalty: Subtracted from a token's logit once per occurrence of the token in the
            generated output (OpenAI `frequency_penalty`), in logit units. In [-2, 2]; positive
            values discourage verbatim repetition. 0 disables it.
        repetition_penalty: Multiplicative penalty (CTRL, Keskar et al. 2019, arXiv:1909.05858;
            Hugging Face / vLLM convention) on every token in the prompt or the output: a positive
            logit is divided by it, a negative logit multiplied by it. > 0; 1 disables it, values
            > 1 discourage repetition, values < 1 encourage it (vLLM extension).
        stop: Strings that end generation when they appear in the decoded output (OpenAI `stop`).
            A single string or a sequence of strings is accepted and stored as a tuple; each must
            be non-empty. The stop string is excluded from the output unless
            `include_stop_str_in_output`.
        stop_token_ids: Token ids that end generation when sampled (vLLM extension), in addition to
            the model's EOS token. A single id or a sequence of ids is accepted and stored as a
            tuple; each must be >= 0. The stop token is kept in the output token ids but, being
            special, is normally not rendered as text.
        ignore_eos: Keep generating after the model's EOS token (vLLM extension; for benchmarks).
            Explicit `stop` / `stop_token_ids` still apply.
        max_tokens: Maximum number of tokens to generate, >= 1, or None to generate until the
            context window is full (OpenAI `max_tokens`; vLLM's default is 16).
        logprobs: Number of top alternatives to return per generated token, in [0, 20], or None for
            no logprobs (OpenAI completions `logprobs`). With k >= 0 each step returns the sampled
            token's logprob (natural log) plus the k most likely tokens' logprobs, as in vLLM; the
            sampled token may or may not be among the k. Values are of the raw model distribution
            (before penalties, temperature and truncation), vLLM's default.
        include_stop_str_in_output: Keep the matched `stop` string at the end of the output text
            (vLLM extension). Default False, matching OpenAI.
        skip_special_tokens: Omit special tokens (BOS, EOS, chat-template markers) when decoding
            token ids to text (vLLM extension). Default True.
        min_tokens: Generate at least this many tokens before EOS or a `stop_token_ids` entry can be
            sampled (their logits are -inf until then) or a stop string can end the sequence (vLLM
            extension). Integer >= 0, at most `max_tokens`.
        logit_bias: Added to the model's logit of each listed token before sampling (OpenAI
            `logit_bias`), in logit units in [-100, 100]: -100 in effect bans a token, 100 in effect
            forces it. A mapping token id -> bias is accepted and stored as a tuple of (id, bias)
            pairs sorted by id; ids must be >= 0 (the sampler checks them against the vocabulary).
        guided_json: A JSON Schema, as JSON text, that the output must follow (`response_format`),
            or None. Consumed by the engine, which samples through `serving.guided.decoding.JsonGuide`;
            the schema subset is `serving.guided.automaton`'s.
        structural_tag: Tagged JSON blocks the output must be, as JSON text, or None (vLLM's structural
            tag; forced tool calls): {"structures": [{"begin": str, "schema": JSON Schema, "end": str}],
            "max_blocks": int >= 1 (default 1), "separator": str (default "\\n")}; the output is 1 to
            max_blocks blocks `begin + document + end`, joined by the separator. At most one of
            `guided_json` and `structural_tag`.
        strip_leading_space: Drop one space at the start of the output text (the token ids keep it).
            Set by the in-context chat format, whose replies follow "Assistant:" and open with a space.
        echo_markers: () or the (opening, closing) markers of a tool result block (set after a tool result;
            `serving.engine.stop.answer_start`): blocks the model writes before any answer text echo the harness's
            rendering: EOS (unless `ignore_eos`) is refused while the output is only such blocks, so the model
            goes on to answer; the opening marker after answer text stops it, like a stop string.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = field(default=())
    guided_json: str | None = None
    structural_tag: str | None = None
    strip_leading_space: bool = False
    echo_markers: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        # Normalize `stop` / `stop_token_ids` (str / int / list / None -> tuple) so the object is
        # hashable and comparisons do not depend on the container the caller used.
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        else:
            try:
                stop = tuple(stop)
            except TypeError:
                raise _fail("stop", self.stop, "a string or a sequence of strings") from None
        object.__setattr__(self, "stop", stop)

        ids = self.stop_token_ids
        if ids is None:
            ids = ()
        elif _is_int(ids):
            ids = (ids,)
        else:
            try:
                ids = tuple(ids)
            except TypeError:
                raise _fail(
                    "stop_token_ids", self.stop_token_ids, "an int or a sequence of ints"
                ) from None
        object.__setattr__(self, "stop_token_ids", ids)

        bias = self.logit_bias
        if bias is None:
            bias = ()
        elif isinstance(bias, dict):
            bias = tuple(sorted(bias.items(), key=lambda item: item[0] if _is_int(item[0]) else -1))
        else:
            try:
                bias = tuple(tuple(pair) for pair in bias)
            except TypeError:
                raise _fail("logit_bias", self.logit_bias, "a mapping of token ids to biases") from None
        object.__setattr__(self, "logit_bias", bias)

        self._validate()

    def _validate(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise _fail("n", self.n, "an integer >= 1")
        _check_float(
            "temperature", self.temperature, self.temperature >= 0, "a number >= 0 (0 = greedy)"
        )
        _check_float("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise _fail("top_k", self.top_k, "an integer >= -1 (0 or -1 disables it)")
        _check_float("min_p", self.min_p, 0 <= self.min_p <= 1, "in [0, 1]")
        if self.seed is not None and (
            not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX
        ):
            raise _fail("seed", self.seed, f"None or an integer in [{SEED_MIN}, {SEED_MAX}]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_float(name, value, -2 <= value <= 2, "in [-2, 2]")
        _check_float(
            "repetition_penalty",
            self.repetition_penalty,
            0 < self.repetition_penalty < math.inf,
            "a finite number > 0 (1 disables it)",
        )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise _fail(
                    "stop", self.stop, "a non-empty string or a sequence of non-empty strings"
                )
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise _fail("stop_token_ids", self.stop_token_ids, "a sequence of integers >= 0")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            if _is_int(self.max_tokens):
                raise _fail("max_tokens", self.max_tokens, "at least 1")
            raise _fail("max_tokens", self.max_tokens, "None or an integer >= 1")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise _fail("logprobs", self.logprobs, f"None or an integer in [0, {MAX_LOGPROBS}]")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise _fail("min_tokens", self.min_tokens, "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _fail("min_tokens", self.min_tokens, f"at most max_tokens ({self.max_tokens})")
        for pair in self.logit_bias:
            ok = len(pair) == 2 and _is_int(pair[0]) and pair[0] >= 0 and _is_number(pair[1])
            if not ok or math.isnan(pair[1]) or not -MAX_LOGIT_BIAS <= pair[1] <= MAX_LOGIT_BIAS:
                raise _fail("logit_bias", dict(self.logit_bias) if ok else self.logit_bias,
                            f"a mapping of token ids >= 0 to biases in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        if self.guided_json is not None and not isinstance(self.guided_json, str):
            raise _fail("guided_json", self.guided_json, "None or a JSON Schema as JSON text")
        if self.structural_tag is not None and (not isinstance(self.structural_tag, str) or self.guided_json is not None):
            raise _fail("structural_tag", self.structural_tag, "None or a structural tag as JSON text, without guided_json")
        if self.echo_markers != () and not (len(self.echo_markers) == 2 and all(isinstance(m, str) for m in self.echo_markers)
                                           and self.echo_markers[0]):
            raise _fail("echo_markers", self.echo_markers, "() or (opening, closing) strings, the opening one non-empty")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "strip_leading_space"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, getattr(self, name), "a bool")

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax: `temperature == 0` or `top_k == 1`."""
        return self.temperature == 0 or self.top_k == 1

    @property
    def sampling_type(self) -> SamplingType:
        """GREEDY if `is_greedy`, else RANDOM_SEED when `seed` is set, else RANDOM."""
        if self.is_greedy:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM
