"""Logits processors: the transforms between a model's logits and the draw, for one sequence.

In `Sampler.sample`'s order (the order vLLM and Hugging Face use):

0. `apply_logit_bias` (OpenAI `logit_bias`, added to the model's logits) and `mask_stop_tokens`
   (vLLM `min_tokens`: EOS and stop token ids at -inf until `min_tokens` tokens were generated);
   vLLM v1 applies both before the penalties too.
1. `apply_penalties`: repetition penalty (prompt + output), then frequency and presence
   penalties (output only).
2. `apply_temperature_and_truncation`: divide by the temperature, then top-k, top-p, min-p;
   each truncation step sees the distribution renormalized over the tokens the previous
   step kept.

All public functions take one sequence's logits of shape [V] (V = vocabulary size) and return a new
float32 tensor. The private helpers work on the last dimension of [..., V] tensors and take either
Python scalars or tensors of shape [..., 1] for their parameters, so a batched sampler can apply them
to [B, V] rows with per-row parameters without Python loops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from serving.sampling.params import SamplingParams

__all__ = ["apply_logit_bias", "apply_penalties", "apply_temperature_and_truncation", "check_logits", "mask_stop_tokens"]

# Scalar (one sequence) or per-row tensor of shape [..., 1] (batched use).
_Scalar = float | int | torch.Tensor


# --------------------------------------------------------------------------------------------
# Row-wise helpers on [..., V]
# --------------------------------------------------------------------------------------------


def check_logits(logits: torch.Tensor) -> None:
    """Raises:
        TypeError: `logits` is not a tensor.
        ValueError: `logits` is not a non-empty 1-D floating tensor.
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.ndim != 1 or logits.shape[0] == 0:
        raise ValueError(f"logits must have shape [V] with V >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")


def _ids_tensor(
    ids: Sequence[int], vocab_size: int, device: torch.device, name: str
) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(-1)
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(
                f"{name} must be token ids in [0, {vocab_size}), got min {lo}, max {hi}"
            )
    return t


def _token_counts(ids: torch.Tensor, vocab_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Occurrences of each token id: ids [..., L] (long) -> counts [..., V] of `dtype`."""
    counts = torch.zeros(*ids.shape[:-1], vocab_size, dtype=dtype, device=ids.device)
    return counts.scatter_add_(-1, ids, torch.ones_like(ids, dtype=dtype))


def _repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: _Scalar) -> torch.Tensor:
    """CTRL-style penalty on tokens where `seen` ([..., V] bool) is set: x/p if x > 0 else x*p."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def _frequency_presence_penalty(
    logits: torch.Tensor, counts: torch.Tensor, frequency: _Scalar, presence: _Scalar
) -> torch.Tensor:
    """OpenAI formula: x - frequency * count - presence * (count > 0)."""
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def _mask_top_k(logits: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """Keep tokens whose logit is >= the k-th largest (k >= 1); ties at the boundary are kept."""
    vocab_size = logits.shape[-1]
    if isinstance(k, torch.Tensor):
        k = k.to(torch.long).clamp(1, vocab_size)
        kth = torch.topk(logits, int(k.max()), dim=-1).values.gather(-1, k - 1)
    else:
        k = min(k, vocab_size)
        kth = torch.topk(logits, k, dim=-1).values[..., k - 1 :]
    return logits.masked_fill(logits < kth, float("-inf"))


def _mask_top_p(logits: torch.Tensor, top_p: _Scalar) -> torch.Tensor:
    """Nucleus: keep the most likely tokens until their mass first reaches `top_p` (0 < p <= 1).

    Token i (in descending-probability order) is kept when the mass of the tokens before it is
    < top_p, so the top token is always kept. Tokens tied with the last kept one are kept too,
    so the result does not depend on how the sort orders ties.
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float64)
    sorted_probs = torch.sort(probs, dim=-1, descending=True).values
    mass_before = F.pad(torch.cumsum(sorted_probs, dim=-1)[..., :-1], (1, 0))
    num_kept = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
    threshold = sorted_probs.gather(-1, num_kept - 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def _mask_min_p(logits: torch.Tensor, min_p: _Scalar) -> torch.Tensor:
    """Drop tokens whose probability is < min_p * (probability of the most likely token)."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


# --------------------------------------------------------------------------------------------
# Public API (one sequence, logits of shape [V])
# --------------------------------------------------------------------------------------------


def apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Add `params.logit_bias` to one sequence's logits: x[id] + bias for each (id, bias) pair.

    Args:
        logits: Model logits, shape [V], any floating dtype. Not modified.
        params: The request's sampling parameters.

    Returns:
        A new float32 tensor of shape [V] (an equal copy when there is no bias).

    Raises:
        TypeError, ValueError: as `apply_penalties`; ValueError names a biased id outside [0, V).
    """
    check_logits(logits)
    out = logits.to(torch.float32, copy=True)
    if params.logit_bias:
        ids = _ids_tensor([tid for tid, _ in params.logit_bias], out.shape[0], out.device, "logit_bias token ids")
        out[ids] += torch.tensor([bias for _, bias in params.logit_bias], dtype=torch.float32, device=out.device)
    return out


def mask_stop_tokens(
    logits: torch.Tensor, params: SamplingParams, num_output_tokens: int, eos_token_ids: Sequence[int] = ()
) -> torch.Tensor:
    """vLLM's `min_tokens`: while fewer than `params.min_tokens` tokens were generated, set the logits of
    the EOS ids (unless `ignore_eos`) and of `params.stop_token_ids` to -inf.

    Args:
        logits: Logits, shape [V], any floating dtype. Not modified.
        params: The request's sampling parameters.
        num_output_tokens: tokens generated so far (before the one being sampled).
        eos_token_ids: the model's end-of-sequence / end-of-turn ids.

    Returns:
        A new float32 tensor of shape [V]; ids outside [0, V) are ignored.
    """
    check_logits(logits)
    out = logits.to(torch.float32, copy=True)
    if num_output_tokens < params.min_tokens:
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        ids = [t for t in stops if 0 <= t < out.shape[0]]
        if ids:
            out[torch.tensor(ids, dtype=torch.long, device=out.device)] = float("-inf")
    return out


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> torch.Tensor:
    """Apply the repetition, frequency and presence penalties of `params` to one sequence's logits.

    Args:
        logits: Model logits (unnormalized log-probabilities, natural-log units), shape [V], any
            floating dtype. Not modified.
        params: The request's sampling parameters.
        prompt_ids: Token ids of the prompt (each in [0, V)).
        output_ids: Token ids generated so far (each in [0, V)).

    Returns:
        A new float32 tensor of shape [V]:

        * Repetition penalty p (CTRL, Keskar et al. 2019, arXiv:1909.05858, with the Hugging Face /
          vLLM sign convention), applied once to every distinct token in prompt + output: a
          positive logit becomes x / p, a negative one x * p (so p > 1 always makes the token less
          likely).
        * Then, over the output tokens only (OpenAI API reference, "Parameter details" of
          frequency and presence penalties): x - frequency_penalty * count -
          presence_penalty * (count > 0), where count is the token's number of occurrences in
          `output_ids`.

        Penalties at their neutral values (1, 0, 0) are skipped, so the result is then an equal
        copy of `logits`.

    Raises:
        TypeError: `logits` is not a tensor.
        ValueError: `logits` is not a non-empty 1-D floating tensor, or a token id lies outside
            [0, V).
    """
    check_logits(logits)
    out = logits.to(torch.float32, copy=True)
    vocab_size = out.shape[-1]
    output = _ids_tensor(output_ids, vocab_size, out.device, "output_ids")

    if params.repetition_penalty != 1.0:
        prompt = _ids_tensor(prompt_ids, vocab_size, out.device, "prompt_ids")
        seen = _token_counts(torch.cat([prompt, output]), vocab_size, torch.float32) > 0
        out = _repetition_penalty(out, seen, params.repetition_penalty)

    if (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and output.numel():
        counts = _token_counts(output, vocab_size, torch.float32)
        out = _frequency_presence_penalty(
            out, counts, params.frequency_penalty, params.presence_penalty
        )
    return out


def apply_temperature_and_truncation(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Scale one sequence's logits by the temperature and mask the tokens truncation removes.

    Steps, in order (vLLM's order); each step's probabilities are the softmax of the logits the
    previous steps left, i.e. renormalized over the surviving tokens:

    1. Temperature: x / temperature (dimensionless). Skipped when `params.is_greedy`.
    2. Top-k (`top_k` > 0): keep the k tokens with the largest logits; tokens tied with the k-th
       are kept as well, so slightly more than k may survive on exact ties.
    3. Top-p / nucleus (`top_p` < 1; Holtzman et al. 2019, arXiv:1904.09751): keep the smallest
       set of most likely tokens whose probability mass is >= top_p. The most likely token is
       always kept; tokens tied with the last kept one are kept too.
    4. Min-p (`min_p` > 0; Nguyen et al. 2024, arXiv:2407.01082): drop tokens whose probability
       is < min_p * (probability of the most likely token).

    Args:
        logits: Logits (natural-log units), shape [V], any floating dtype, usually the output of
            `apply_penalties`. Not modified.
        params: The request's sampling parameters.

    Returns:
        A new float32 tensor of shape [V]: surviving tokens hold x / temperature, removed tokens
        -inf. The most likely token always survives.

    Raises:
        TypeError: `logits` is not a tensor.
        ValueError: `logits` is not a non-empty 1-D floating tensor.
    """
    check_logits(logits)
    out = logits.to(torch.float32, copy=True)
    if not params.is_greedy and params.temperature != 1.0:
        out = out / params.temperature
    if params.top_k > 0:
        out = _mask_top_k(out, params.top_k)
    if params.top_p < 1.0:
        out = _mask_top_p(out, params.top_p)
    if params.min_p > 0.0:
        out = _mask_min_p(out, params.min_p)
    return out
