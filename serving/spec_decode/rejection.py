"""Acceptance rules of speculative decoding, as pure functions over token ids and probability tensors.

Leviathan, Kalman and Matias 2023, "Fast inference from transformers via speculative decoding" (ICML),
and Chen et al. 2023, "Accelerating large language model decoding with speculative sampling"
(arXiv:2302.01318): a draft token x drawn from q is kept with probability min(1, p(x) / q(x)); on the
first rejection the replacement is drawn from norm(max(0, p - q)); when all k drafts are kept a bonus
token is drawn from the target's next distribution. The emitted tokens are then distributed exactly as
if drawn from p one at a time.

A deterministic draft (prompt lookup, or a draft model decoding greedily) is a point mass: q(x) = 1, so
x is kept with probability p(x), and the replacement is drawn from p with x removed and renormalised.
A deterministic target (greedy decoding) is a point mass too: x is kept iff it is the target's token,
which makes greedy speculative decoding token-for-token identical to plain greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Target = int | torch.Tensor  # a deterministic token, or probabilities [V] (`Sampler.distribution`)


def num_greedy_accepted(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> int:
    """Length of the longest prefix where draft_tokens[i] == target_tokens[i] (target_tokens has k + 1
    entries, the last one the bonus position's, never compared)."""
    for i, token in enumerate(draft_tokens):
        if token != target_tokens[i]:
            return i
    return len(draft_tokens)


def rejection_sample(draft_tokens: Sequence[int], targets: Sequence[Target], generator: torch.Generator,
                     draft_probs: torch.Tensor | None = None) -> list[int]:
    """The tokens to emit for one sequence: the accepted drafts, then one token from the target.

    Args:
        draft_tokens: the k drafted token ids.
        targets: k + 1 target distributions; targets[i] is the one after draft i - 1 was kept
            (targets[0]: after the last verified token), each a token id (deterministic) or float
            probabilities [V] summing to 1.
        generator: the request's random generator (CPU); one uniform per stochastic comparison, one
            draw per stochastic replacement or bonus.
        draft_probs: [k, V] the draft's distributions q, or None for a deterministic draft (q = point
            mass at each draft token).

    Returns:
        a + 1 token ids: the a accepted drafts, then the replacement (a < k) or the bonus token (a = k).

    Raises:
        ValueError: targets does not have k + 1 entries.
    """
    k = len(draft_tokens)
    if len(targets) != k + 1:
        raise ValueError(f"need k + 1 = {k + 1} target distributions, got {len(targets)}")
    out: list[int] = []
    for i, x in enumerate(draft_tokens):
        p = targets[i]
        if isinstance(p, int):
            if x == p:
                out.append(x)
                continue
            return out + [p]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        p_x = float(p[x])
        if float(torch.rand((), generator=generator)) * q_x < p_x:  # u < p(x) / q(x), without dividing by 0
            out.append(x)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - draft_probs[i].to(p.dtype)).clamp_(min=0.0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p  # total > 0 whenever a rejection has positive probability
        return out + [int(torch.multinomial(residual, 1, generator=generator))]
    bonus = targets[k]
    return out + [bonus if isinstance(bonus, int) else int(torch.multinomial(bonus, 1, generator=generator))]
