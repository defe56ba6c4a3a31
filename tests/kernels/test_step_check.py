"""The whole-step check (`kernels.step_check`) on its own and inside the `Tuner`, with a fake model whose
"hidden states" are its logits (an identity LM head), so each fake variant moves the logits exactly:
a shift within the scale-relative tolerance passes, a flipped greedy token or an error over the
tolerance is rejected and logged."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

import kernels
import kernels.tuner as tuner_module
from kernels.recorder import Bucket
from kernels.step_check import STEP_TOLERANCE, check_step_logits
from kernels.tuner import Tuner
from kernels.variants import Variant
from kernels.winners import WinnerTable

MODEL = "fake-model"
VOCAB = 37
MARGIN = 1e-3  # every row's top logit is this far above its runner-up: a near tie a wrong variant can flip
ATOL, RTOL = STEP_TOLERANCE[torch.float32]


class FakeCache:
    def __init__(self, num_blocks: int, block_size: int):
        self.keys = [torch.zeros(num_blocks, block_size, 1, 4)]
        self.values = [torch.zeros(num_blocks, block_size, 1, 4)]

    def write(self, layer, slots, k, v) -> None:
        pass


class FakeModel:
    """Token t's logits are row t of a fixed table (|logits| up to ~20), with a near tie at the top."""

    def __init__(self):
        gen = torch.Generator().manual_seed(1)
        table = torch.randn(VOCAB, VOCAB, generator=gen) * 6
        top2 = table.topk(2, dim=-1)
        table.scatter_(1, top2.indices[:, 1:], top2.values[:, :1] - MARGIN)
        self.table = table
        self.config = SimpleNamespace(vocab_size=VOCAB)

    def allocate_cache(self, num_blocks: int, block_size: int) -> FakeCache:
        return FakeCache(num_blocks, block_size)

    def __call__(self, token_ids, batch, cache) -> torch.Tensor:
        return self.table[token_ids]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float()


def _shifted(model, token_ids, batch, cache):
    """Every logit 3e-3 higher: the size of Inductor's reordering error at |logits| ~20. The former
    element-wise check (1e-3 + 1e-3 |x|) failed it on small logits; the greedy tokens are unchanged."""
    return model(token_ids, batch, cache) + 3e-3


def _flipped(model, token_ids, batch, cache):
    """The runner-up raised by 2 x MARGIN: the error is within the tolerance, the greedy token changes."""
    logits = model(token_ids, batch, cache).clone()
    runner_up = logits.topk(2, dim=-1).indices[:, 1:]
    return logits.scatter_add(1, runner_up, torch.full_like(runner_up, 2 * MARGIN, dtype=logits.dtype))


def _scaled(model, token_ids, batch, cache):
    """1% larger: the same greedy tokens, an error far over the tolerance."""
    return model(token_ids, batch, cache) * 1.01


FAKES = [Variant("decode_step", name, fn, tolerance=dict(STEP_TOLERANCE))
         for name, fn in (("shifted", _shifted), ("flipped", _flipped), ("scaled", _scaled))]


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    kernels.reset()
    monkeypatch.setattr(tuner_module, "variants", lambda op: [v for v in FAKES if v.op == op])
    yield
    kernels.reset()


def test_check_passes_a_shift_within_the_scale_relative_tolerance():
    expected = FakeModel().table[:5]
    error, max_error = check_step_logits(expected, expected + 3e-3, ATOL, RTOL)
    assert error is None and max_error == pytest.approx(3e-3, rel=1e-3)
    assert not torch.allclose(expected + 3e-3, expected, atol=1e-3, rtol=1e-3)  # what the element-wise check said


def test_check_rejects_a_flipped_greedy_token_within_the_tolerance():
    expected = FakeModel().table[:5]
    got = _flipped(lambda *args: expected, None, None, None)
    assert (got - expected).abs().max() <= RTOL * expected.abs().max()
    error, _ = check_step_logits(expected, got, ATOL, RTOL)
    assert error is not None and error.startswith("row 0: greedy token changed") and "5 of 5 rows changed" in error


def test_check_rejects_an_error_over_the_tolerance():
    expected = FakeModel().table[:5]
    error, max_error = check_step_logits(expected, expected * 1.01, ATOL, RTOL)
    assert error is not None and "over the bound" in error and max_error > 0.05
    assert check_step_logits(expected, expected[:4], ATOL, RTOL)[0].startswith("shape")
    assert check_step_logits(expected, expected + float("nan"), ATOL, RTOL)[0] == "non-finite logits"


def test_tuner_rejects_and_logs_step_variants_that_change_greedy_tokens_or_exceed_the_tolerance(tmp_path, caplog):
    tuner = Tuner(WinnerTable(tmp_path / "winners.sqlite"), MODEL, model=FakeModel(), repeats=3, warmup=1)
    bucket = Bucket("decode_step", ((4,),), "float32", MODEL)
    with caplog.at_level(logging.WARNING, logger="kernels.tuner"):
        results = {r.variant: r for r in tuner.tune({bucket: 50})}
    assert results["shifted"].status in ("passed", "winner")
    assert results["shifted"].max_error == pytest.approx(3e-3, rel=1e-3)
    assert results["flipped"].status == "rejected" and "greedy token changed" in results["flipped"].message
    assert results["scaled"].status == "rejected" and "over the bound" in results["scaled"].message
    logged = [rec.message for rec in caplog.records]
    assert any("rejected variant flipped for decode_step 4" in m and "greedy token changed" in m for m in logged)
    assert any("rejected variant scaled for decode_step 4" in m for m in logged)
    stored = {r.variant: r.status for r in tuner.table.results(tuner.env)}
    assert stored["flipped"] == stored["scaled"] == "rejected"


def test_near_ties_admit_a_flip_inside_the_bound_and_no_other():
    """A lossy variant (`near_ties=True`) may change a greedy token whose reference logit is within the row's
    bound b of the best; one ranked 1.5 b below is still rejected, though every logit moved by only 0.9 b."""
    expected = FakeModel().table[:5]
    flipped = _flipped(lambda *args: expected, None, None, None)  # the runner-up, MARGIN below, now on top
    assert check_step_logits(expected, flipped, ATOL, RTOL)[0] is not None
    assert check_step_logits(expected, flipped, ATOL, RTOL, near_ties=True)[0] is None
    row = expected[:1].clone()
    bound = ATOL + RTOL * float(row.abs().max())
    best = int(row.argmax())
    other = int(row.topk(2).indices[0, 1])  # the runner-up, moved to 1.5 b below the best
    row[0, other] = row[0, best] - 1.5 * bound
    got = row.clone()
    got[0, best] -= 0.9 * bound
    got[0, other] += 0.9 * bound
    assert int(got.argmax()) == other
    error, max_error = check_step_logits(row, got, ATOL, RTOL, near_ties=True)
    assert max_error == pytest.approx(0.9 * bound, rel=1e-4)
    assert error is not None and error.startswith("row 0: greedy token changed")


def test_a_lossy_step_variant_is_a_candidate_only_when_allowed(tmp_path, monkeypatch):
    lossy = Variant("decode_step", "lossy", _shifted, tolerance=dict(STEP_TOLERANCE), lossy=True)
    monkeypatch.setattr(tuner_module, "variants", lambda op: [*FAKES, lossy] if op == "decode_step" else [])
    table = WinnerTable(tmp_path / "winners.sqlite")
    strict = Tuner(table, MODEL, model=FakeModel())
    allowed = Tuner(table, MODEL, model=FakeModel(), allow_lossy=True)
    assert [v.name for v in strict.candidates("decode_step", torch.float32)] == ["shifted", "flipped", "scaled"]
    assert [v.name for v in allowed.candidates("decode_step", torch.float32)] == ["shifted", "flipped", "scaled", "lossy"]
