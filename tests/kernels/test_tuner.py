"""The `Tuner` and its `WinnerTable` with fake variants (no compilation): a wrong variant is rejected and
logged, the winner is swapped in and equals the reference, the table survives a restart, and a traffic
shift tunes only the buckets that became hot. The default is made slow (a sleep), so the correct fake
variant wins deterministically."""

from __future__ import annotations

import logging
import time

import pytest
import torch

import kernels
import kernels.tuner as tuner_module
from kernels import ref
from kernels.recorder import Bucket
from kernels.background import BackgroundTuner
from kernels.tuner import Tuner
from kernels.variants import Variant
from kernels.winners import WinnerTable

MODEL = "test-model"
HOT = Bucket("rms_norm", ((2, 24),), "float32")
SHIFTED = Bucket("rms_norm", ((16, 24),), "float32")


def _slow_default(x, weight, eps, *, offset=0.0):
    time.sleep(0.003)
    return ref.ref_rms_norm(x, weight, eps, offset=offset)


CALLS: list[int] = []


def _good(x, weight, eps, *, offset=0.0):
    CALLS.append(x.shape[0])
    return ref.ref_rms_norm(x, weight, eps, offset=offset)


def _wrong(x, weight, eps, *, offset=0.0):
    return ref.ref_rms_norm(x, weight, eps, offset=offset) * 1.01  # 1% off: outside fp32 tolerance


FAKES = [Variant("rms_norm", "good", _good, exact=True), Variant("rms_norm", "wrong", _wrong)]


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    kernels.reset()
    kernels.register("rms_norm", _slow_default)
    monkeypatch.setattr(tuner_module, "variants", lambda op: [v for v in FAKES if v.op == op])
    CALLS.clear()
    yield
    kernels.reset()


@pytest.fixture
def table(tmp_path):
    return WinnerTable(tmp_path / "compile" / "winners.sqlite")


def test_wrong_variant_rejected_and_logged_winner_installed(table, caplog):
    tuner = Tuner(table, MODEL, repeats=3, warmup=1)
    with caplog.at_level(logging.WARNING, logger="kernels.tuner"):
        results = tuner.tune({HOT: 100})
    verdicts = {r.variant: r.status for r in results}
    assert verdicts == {"good": "winner", "wrong": "rejected"}
    assert any("rejected variant wrong" in rec.message and "rms_norm 2x24" in rec.message for rec in caplog.records)
    rejected = next(r for r in table.results(tuner.env) if r.variant == "wrong")
    assert rejected.status == "rejected" and "outside atol" in rejected.message
    winner = table.winners(tuner.env)[HOT]
    assert winner.variant == "good" and winner.speedup > 1.05
    # staged until the engine's next step, then serving only its bucket
    assert kernels.installed() == {}
    kernels.apply_pending()
    assert kernels.installed() == {HOT: "good"}
    CALLS.clear()
    x, w = torch.randn(2, 24), torch.randn(24)
    torch.testing.assert_close(kernels.dispatch("rms_norm", x, w, 1e-6), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    kernels.dispatch("rms_norm", torch.randn(9, 24), w, 1e-6)  # bucket 16: not tuned, the default
    assert CALLS == [2]


def test_winner_table_survives_a_restart_without_retuning(table, monkeypatch):
    Tuner(table, MODEL, repeats=3, warmup=1).tune({HOT: 100})
    kernels.reset()
    restarted = Tuner(WinnerTable(table.path), MODEL)

    def no_timing(*args, **kwargs):
        raise AssertionError("a stored winner must not be timed again")

    monkeypatch.setattr(Tuner, "_time", no_timing)
    assert restarted.install_known() == 1
    kernels.apply_pending()
    assert kernels.installed() == {HOT: "good"}
    assert restarted.tune({HOT: 500}) == []  # already has a verdict
    assert Tuner(WinnerTable(table.path), "another-model").install_known() == 0  # keyed by model


def test_traffic_shift_tunes_only_the_new_buckets(table):
    tuner = Tuner(table, MODEL, repeats=3, warmup=1)
    first = tuner.tune({HOT: 100})
    assert {r.bucket for r in first} == {HOT}
    shifted = tuner.tune({HOT: 10, SHIFTED: 300})
    assert {r.bucket for r in shifted} == {SHIFTED}
    kernels.apply_pending()
    assert kernels.installed() == {HOT: "good", SHIFTED: "good"}


def test_cold_buckets_are_not_tuned(table):
    cold = Bucket("rms_norm", ((64, 24),), "float32")
    results = Tuner(table, MODEL, repeats=3, warmup=1, min_share=0.05).tune({HOT: 1000, cold: 3})
    assert {r.bucket for r in results} == {HOT}


def test_background_round_saves_counts_and_tunes_the_recorded_shift(table):
    recorder = kernels.ShapeRecorder()
    kernels.attach_recorder(recorder)
    try:
        background = BackgroundTuner(Tuner(table, MODEL, repeats=3, warmup=1), recorder, budget_s=60)
        for _ in range(5):
            kernels.dispatch("rms_norm", torch.randn(2, 24), torch.ones(24), 1e-6)
        assert {r.bucket for r in background.run_round()} == {HOT}
        for _ in range(5):
            kernels.dispatch("rms_norm", torch.randn(13, 24), torch.ones(24), 1e-6)
        assert {r.bucket for r in background.run_round()} == {SHIFTED}
        assert table.counts(MODEL) == {HOT: 5, SHIFTED: 5}
    finally:
        kernels.attach_recorder(None)


def test_hotness_is_per_weight_shape_and_order_by_work(table):
    """A decode step calls the LM head once beside 60 layer projections: 1.6% of the linear calls, yet a
    bucket of its own site (weight shape), and the most work (M x N x K) of them all."""
    qkv = Bucket("linear", ((1, 576), (960, 576)), "float32")
    o_proj = Bucket("linear", ((1, 576), (576, 576)), "float32")
    lm_head = Bucket("linear", ((1, 576), (49152, 576)), "float32")
    rare = Bucket("linear", ((512, 576), (960, 576)), "float32")  # a prefill chunk now and then
    counts = {qkv: 3000, o_proj: 3000, lm_head: 100, rare: 30}
    tuner = Tuner(table, MODEL, min_share=0.02)
    assert [b for b, _ in tuner.hot_buckets(counts)] == [lm_head, qkv, o_proj]  # 2.8e9, 1.7e9, 1.0e9 MACs
    assert [b for b, _ in Tuner(table, MODEL, min_share=0.005).hot_buckets(counts)] == [rare, lm_head, qkv, o_proj]  # rare: 8.5e9


def test_matmul_candidates_are_timed_on_streamed_weight_copies(table):
    # a decode step reads every layer's weights from memory: a linear is timed over copies of its
    # weight (stream_bytes of them), one call per copy, not on one cache-resident matrix
    weight = torch.randn(256, 256)   # 256 KiB
    x = torch.randn(4, 256)
    tuner = Tuner(table, MODEL, repeats=3, warmup=1, stream_bytes=1 << 20)
    cases = tuner._streamed("linear", ((x, weight), {}))
    assert len(cases) == 4
    assert len({c[0][1].data_ptr() for c in cases}) == 4 and all(torch.equal(c[0][1], weight) for c in cases)
    assert all(c[0][0] is x for c in cases)   # the input is shared, only the weights stream
    seen = []
    tuner._time(lambda x, w: seen.append(w.data_ptr()), cases)
    assert len(seen) == (1 + 3) * 4 and set(seen) == {c[0][1].data_ptr() for c in cases}
    assert len(tuner._streamed("rms_norm", ((x, torch.ones(256), 1e-6), {}))) == 1   # not a matmul
    assert len(Tuner(table, MODEL, stream_bytes=0)._streamed("linear", ((x, weight), {}))) == 1


def test_a_linear_wrong_only_on_the_models_own_weight_is_rejected(table, monkeypatch):
    """A lossless matmul variant is checked and timed on the model's own weight of the bucket's shape too
    (a clone of it): one right on random weights but wrong on the model's (as a wrong pack of a real weight
    would be) is rejected, and the timed calls see the model's values."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.randn(40, 32), requires_grad=False)
    timed_weights = []

    def wrong_on_model(x, weight, bias=None):
        timed_weights.append(weight)
        out = torch.nn.functional.linear(x, weight, bias)
        return out * 1.01 if torch.equal(weight, model.weight) else out  # the model's values, in any tensor

    def slow_default(x, weight, bias=None):
        time.sleep(0.002)
        return torch.nn.functional.linear(x, weight, bias)

    kernels.register("linear", slow_default)
    fakes = [Variant("linear", "wrong-on-model", wrong_on_model), Variant("linear", "right", lambda x, w, b=None: x @ w.T)]
    monkeypatch.setattr(tuner_module, "variants", lambda op: [v for v in fakes if v.op == op])
    bucket = Bucket("linear", ((4, 32), (40, 32)), "float32")
    results = {r.variant: r for r in Tuner(table, MODEL, model=model, repeats=2, warmup=1, stream_bytes=0).tune_bucket(bucket)}
    assert results["wrong-on-model"].status == "rejected"
    assert "model's own weights" in results["wrong-on-model"].message
    assert results["right"].status == "winner"
    timed_weights.clear()
    fakes[0] = Variant("linear", "records", lambda x, w, b=None: timed_weights.append(w) or torch.nn.functional.linear(x, w, b))
    table2 = WinnerTable(table.path.parent / "other.sqlite")
    Tuner(table2, MODEL, model=model, repeats=2, warmup=1, stream_bytes=0).tune_bucket(bucket)
    # checked and timed (warm-up, repeats) on a clone of it: the packs a losing variant caches go with it
    clones = [w for w in timed_weights if w is not model.weight and torch.equal(w, model.weight)]
    assert len(clones) == 1 + 1 + 2
