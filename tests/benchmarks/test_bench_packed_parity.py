"""The packed-against-float parity benchmark's bookkeeping: where two outputs part, and what counts as a near-tie."""

from __future__ import annotations

import torch

from benchmarks.bench_packed_parity import classify, first_divergence


def test_first_divergence_finds_the_first_differing_token_or_a_prefix_end():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([4], [5]) == 0
    assert first_divergence([1, 2], [1, 2, 7]) == 2


def test_a_margin_within_twice_the_models_logit_difference_is_a_near_tie():
    want = torch.tensor([0.0, 10.0, 9.9995, -3.0])          # top-2 margin 5e-4
    got = want + torch.tensor([0.0, -3e-4, 2e-4, 1e-5])      # largest difference 3e-4: 2 x 3e-4 >= 5e-4
    row = classify(want, got)
    assert abs(row["margin"] - 5e-4) < 1e-6 and abs(row["max_logit_diff"] - 3e-4) < 1e-6 and row["near_tie"]
    clear = torch.tensor([0.0, 10.0, 9.0, -3.0])             # margin 1.0 against a difference of 3e-4
    assert not classify(clear, clear + torch.tensor([0.0, -3e-4, 2e-4, 1e-5]))["near_tie"]
