"""The check of a whole-step variant ("decode_step") against the eager model: logits and greedy tokens.

An op variant is compared element by element with its reference (`kernels.variants.DEFAULT_TOLERANCE`).
A whole decode step cannot be: a compiled step reorders the reductions of every matmul and norm in
30 layers (Inductor fuses and splits them differently), so float32 logits of magnitude 10-30 move by
~1e-3 (measured on SmolLM2-135M: 2.5e-3 at most), and an element-wise atol that would admit this
would also admit real errors in small logits. A step variant passes when, for every row (a sequence):

1. max_v |logits_v - ref_v| <= atol + rtol * max_v |ref_v|: the error is bounded relative to the
   row's scale, which is where the rounding comes from (`STEP_TOLERANCE`);
2. argmax(logits) == argmax(ref): the greedy token is the reference's. A variant that changes any
   greedy token is rejected even inside the tolerance, so greedy outputs stay unchanged. For a lossy
   variant (weight-only quantized, bfloat16 activations: `near_ties=True`) a changed token passes when
   the reference ranks it within the row's bound of its best (a near-tie that the stated tolerance
   already admits: on 16 real prompts a bfloat16-rounded SmolLM2 step flipped one whose logits were
   31.001 and 30.928).

    error, max_error = check_step_logits(expected, got, *STEP_TOLERANCE[torch.float32])
"""

from __future__ import annotations

import torch

# (atol, rtol) of a step's logits: |error| <= atol + rtol * (the row's largest |logit|).
# float32: eps 1.2e-7; reordered sums over 576-1536 products per matmul, ~200 matmuls and norms per step,
#   give ~1e-4 of the row's scale (2.5e-3 at |logits| ~25 measured); 5e-4 leaves 5x headroom while a
#   real error (a wrong position, a missed layer, a wrong mask) moves logits by O(1) relative.
# bfloat16: eps 7.8e-3 per rounding, so a step of bf16 ops drifts by a few percent of the scale.
# float16: eps 9.8e-4, between the two.
STEP_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (0.0, 5e-4),
    torch.bfloat16: (0.0, 5e-2),
    torch.float16: (0.0, 1e-2),
}


def check_step_logits(expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float,
                      near_ties: bool = False) -> tuple[str | None, float]:
    """Compare a step variant's logits with the reference's.

    Args:
        expected, got: [B, V] logits (any float dtype; compared in float32).
        atol, rtol: the bound per row, atol + rtol * max |expected row|.
        near_ties: accept a changed greedy token whose reference logit is within the row's bound of the
            reference's largest (lossy variants; see the module docstring).
    Returns:
        (None, max abs error) when every row is within its bound and keeps its greedy token, else
        (what differed: the first such row, its tokens and logits; max abs error).
    """
    expected, got = expected.float(), got.float()
    if expected.shape != got.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}", float("inf")
    if not torch.isfinite(got).all():
        return "non-finite logits", float("inf")
    error = (got - expected).abs().amax(dim=-1)  # [B]
    bound = atol + rtol * expected.abs().amax(dim=-1)
    max_error = float(error.max()) if error.numel() else 0.0
    over = (error > bound).nonzero().flatten().tolist()
    if over:
        row = over[0]
        return (f"row {row}: max abs logit error {float(error[row]):.3g} over the bound {float(bound[row]):.3g} "
                f"(atol {atol:g} + rtol {rtol:g} x max |logit| {float(expected[row].abs().max()):.3g}); "
                f"{len(over)} of {len(error)} rows over"), max_error
    ref_tokens, tokens = expected.argmax(dim=-1), got.argmax(dim=-1)
    changed = ref_tokens != tokens
    if near_ties:
        gap = expected.amax(dim=-1) - expected.gather(-1, tokens[:, None])[:, 0]
        changed &= gap > bound
    flipped = changed.nonzero().flatten().tolist()
    if flipped:
        row = flipped[0]
        a, b = int(ref_tokens[row]), int(tokens[row])
        return (f"row {row}: greedy token changed {a} -> {b} (reference logits {float(expected[row, a]):.6g} vs "
                f"{float(expected[row, b]):.6g}); {len(flipped)} of {len(tokens)} rows changed"), max_error
    return None, max_error
