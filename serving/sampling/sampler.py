"""Choosing the next token from a model's logits, one sequence at a time.

Pipeline of `Sampler.sample` (the order vLLM and Hugging Face use; steps 0, 1 and 3 are the logits
processors of `serving.sampling.logits_processors`):

0. logit bias and the `min_tokens` mask of EOS and stop token ids.
1. penalties: repetition (prompt + output), then frequency and presence (output only).
2. Greedy (`temperature == 0` or `top_k == 1`): argmax, done.
3. temperature, then top-k, top-p, min-p.
4. softmax, and one draw from the request's own `torch.Generator`.

`batched_argmax` decides the plain-greedy rows of a whole batch in one call (`Sampler.is_plain_greedy`).
`compute_logprobs` is separate: the caller passes it the raw model logits (vLLM's default
"raw logprobs"), not the penalized / truncated ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from serving.sampling.logits_processors import apply_logit_bias, apply_penalties, apply_temperature_and_truncation, check_logits, mask_stop_tokens
from serving.sampling.params import SamplingParams

__all__ = ["Sampler", "batched_argmax", "compute_logprobs"]


def compute_logprobs(
    logits: torch.Tensor, token_id: int, k: int
) -> tuple[float, list[tuple[int, float]]]:
    """Log-probabilities of the chosen token and of the k most likely tokens.

    Pass the raw model logits: like vLLM's default (`logprobs_mode="raw_logprobs"`), the values
    describe the model's own distribution, before penalties, temperature and top-k/top-p/min-p.
    This matches the OpenAI `logprobs` semantics as vLLM implements them: the sampled token's
    logprob is always returned, plus the top k, which may or may not include the sampled token.

    Args:
        logits: Raw model logits, shape [V], any floating dtype. Not modified.
        token_id: The sampled token, in [0, V).
        k: How many top tokens to return, >= 0 (`SamplingParams.logprobs`); clamped to V.

    Returns:
        `(chosen_logprob, top)`: the natural-log probability (<= 0, possibly -inf) of `token_id`
        under log_softmax(logits) computed in float32, and a list of `min(k, V)` `(token_id,
        logprob)` pairs sorted by logprob, descending.

    Raises:
        TypeError: `logits` is not a tensor.
        ValueError: `logits` is not a non-empty 1-D floating tensor, `token_id` is outside
            [0, V), or `k` < 0.
    """
    check_logits(logits)
    vocab_size = logits.shape[0]
    if not 0 <= token_id < vocab_size:
        raise ValueError(f"token_id must be in [0, {vocab_size}), got {token_id}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    chosen = float(logprobs[token_id])
    if k == 0:
        return chosen, []
    top = torch.topk(logprobs, min(k, vocab_size), dim=-1, sorted=True)
    return chosen, list(zip(top.indices.tolist(), top.values.tolist(), strict=True))


class Sampler:
    """Draws the next token of one request, with that request's own random generator.

    Build one per request (per sequence): `Sampler(params)`. The generator is a
    `torch.Generator` seeded with `params.seed` when given, so a seeded request produces the same
    tokens regardless of other requests or of the global torch RNG. Without a seed, it is seeded at
    construction with a number drawn from the global torch RNG (`torch.randint`), so
    `torch.manual_seed` before building the sampler makes unseeded requests reproducible too.

    Attributes:
        params: The request's `SamplingParams`.
        seed: The generator's effective seed (`params.seed`, or the one drawn from the global RNG).
    """

    def __init__(
        self, params: SamplingParams, *, eos_token_ids: Sequence[int] = (), device: torch.device | str = "cpu"
    ) -> None:
        """Args:
        params: The request's sampling parameters.
        eos_token_ids: The model's end-of-sequence / end-of-turn ids (masked until `min_tokens`).
        device: Device of the generator. Probabilities are moved there for the draw.
        """
        self.params = params
        self.eos_token_ids = tuple(eos_token_ids)
        if params.seed is not None:
            self.seed = params.seed
        else:
            self.seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(self.seed)

    def is_plain_greedy(self, num_output_tokens: int) -> bool:
        """True when the next token is simply the argmax of the raw logits: greedy, no logit bias, no
        penalty, and no `min_tokens` mask at this length. Such rows can be decided for a whole batch with
        one `argmax` (`batched_argmax`), with the same result as `sample`."""
        p = self.params
        return (p.is_greedy and not p.logit_bias and p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0
                and p.presence_penalty == 0.0 and num_output_tokens >= p.min_tokens)

    def sample(
        self, logits: torch.Tensor, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()
    ) -> int:
        """Choose the next token for one sequence.

        logit bias and `min_tokens` mask -> penalties (`apply_penalties`) -> argmax if `params.is_greedy` (no random numbers drawn;
        the lowest id wins a tie) -> else `apply_temperature_and_truncation` -> softmax -> one
        draw with this sampler's generator (`torch.multinomial`). A temperature so small that
        logits / temperature overflows float32 is treated as greedy.

        Args:
            logits: The model's logits for the next position, shape [V], any floating dtype.
                Not modified.
            prompt_ids: The prompt's token ids (for the repetition penalty).
            output_ids: The token ids generated so far (for all penalties).

        Returns:
            The chosen token id, a Python int in [0, V).

        Raises:
            TypeError: `logits` is not a tensor.
            ValueError: `logits` is not a non-empty 1-D floating tensor, contains NaN or is -inf
                everywhere, or a token id lies outside [0, V).
        """
        choice = self.distribution(logits, prompt_ids, output_ids)
        if isinstance(choice, int):
            return choice
        return int(torch.multinomial(choice.to(self._generator.device), 1, generator=self._generator))

    def distribution(
        self, logits: torch.Tensor, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()
    ) -> int | torch.Tensor:
        """The distribution `sample` draws from: the token itself when the choice is deterministic
        (greedy, or a temperature so small it overflows), else float32 probabilities [V] after every
        processing step. Same arguments and errors as `sample`; draws no random numbers.
        Speculative decoding verifies drafts against it (`serving.spec_decode.rejection`)."""
        check_logits(logits)
        if bool(torch.isnan(logits).any()):
            raise ValueError("logits contain NaN")
        if not bool((logits > float("-inf")).any()):
            raise ValueError("logits are -inf for every token; nothing can be sampled")

        x = apply_logit_bias(logits, self.params)
        x = mask_stop_tokens(x, self.params, len(output_ids), self.eos_token_ids)
        if not bool((x > float("-inf")).any()):
            raise ValueError("min_tokens masked every token that was not already -inf; nothing can be sampled")
        x = apply_penalties(x, self.params, prompt_ids, output_ids)
        if self.params.is_greedy:
            return int(torch.argmax(x))

        scaled = apply_temperature_and_truncation(x, self.params)
        if not bool(torch.isfinite(scaled.max())):
            # A tiny temperature overflowed the logits (to +inf, or all to -inf): softmax would be
            # NaN. Such a temperature leaves all the mass on the top token, so take the argmax.
            return int(torch.argmax(x))
        return torch.softmax(scaled, dim=-1)

    @property
    def generator(self) -> torch.Generator:
        """This sampler's random generator (speculative acceptance draws from it too)."""
        return self._generator


def batched_argmax(rows: list[torch.Tensor]) -> list[int] | None:
    """The argmax of each [V] logits row (lowest id on ties, as `Sampler.sample`), in one call.

    Returns None when a row contains NaN or is -inf everywhere: the caller then samples row by row, so
    the offending sequence gets `sample`'s error.
    """
    best = torch.stack(rows).max(dim=-1)  # over [B, V]; a NaN anywhere in a row makes its maximum NaN
    if not bool((best.values > float("-inf")).all()):  # false for NaN and for -inf
        return None
    return best.indices.tolist()
