"""`ShapeRecorder` and the bucket-aware dispatch: counts per (op, bucket, dtype), power-of-two buckets
of the leading dimension, staged atomic installs, and unchanged results with nothing installed."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import ref
from kernels.recorder import Bucket, ShapeRecorder, bucket_size


@pytest.fixture(autouse=True)
def clean_dispatch():
    kernels.reset()
    previous = kernels.attach_recorder(None)
    yield
    kernels.reset()
    kernels.attach_recorder(previous)


def test_bucket_size_rounds_up_to_powers_of_two():
    assert [bucket_size(n) for n in (0, 1, 2, 3, 4, 5, 12, 16, 17, 33)] == [0, 1, 2, 4, 4, 8, 16, 16, 32, 64]


def test_recorder_counts_calls_per_bucket_with_exact_inner_dims():
    recorder = ShapeRecorder()
    kernels.attach_recorder(recorder)
    w = torch.randn(7, 5)
    for n in (3, 4, 4, 5):
        kernels.dispatch("linear", torch.randn(n, 5), w)
    kernels.dispatch("linear", torch.randn(3, 5, dtype=torch.bfloat16), w.bfloat16())
    kernels.dispatch("rms_norm", torch.randn(3, 6), torch.ones(6), 1e-6)
    counts = recorder.snapshot()
    assert counts == {
        Bucket("linear", ((4, 5), (7, 5)), "float32"): 3,
        Bucket("linear", ((8, 5), (7, 5)), "float32"): 1,
        Bucket("linear", ((4, 5), (7, 5)), "bfloat16"): 1,
        Bucket("rms_norm", ((4, 6),), "float32"): 1,
    }


def test_step_shapes_and_since_mark_give_the_traffic_of_each_period():
    recorder = ShapeRecorder()
    for size in (1, 2, 2):
        recorder.record_step("decode_step", size, torch.float32, "m")
    first = Bucket("decode_step", ((2,),), "float32", "m")
    assert recorder.since_mark() == {Bucket("decode_step", ((1,),), "float32", "m"): 1, first: 2}
    for size in (12, 16, 2):
        recorder.record_step("decode_step", size, torch.float32, "m")
    assert recorder.since_mark() == {Bucket("decode_step", ((16,),), "float32", "m"): 2, first: 1}
    assert recorder.since_mark() == {}


def test_bucket_label_round_trips():
    bucket = Bucket("linear", ((16, 576), (960, 576)), "float32")
    assert bucket.label == "16x576,960x576"
    assert Bucket.parse("linear", bucket.label, "float32") == bucket


def test_recording_does_not_change_results():
    x, w = torch.randn(5, 8), torch.randn(8)
    plain = kernels.dispatch("rms_norm", x, w, 1e-6)
    kernels.attach_recorder(ShapeRecorder())
    assert torch.equal(kernels.dispatch("rms_norm", x, w, 1e-6), plain)


@pytest.mark.parametrize("with_recorder", [False, True])
def test_a_bucket_winner_serves_only_its_bucket_after_apply_pending(with_recorder):
    if with_recorder:
        kernels.attach_recorder(ShapeRecorder())
    calls = []

    def marked(x, weight, bias=None):
        calls.append(x.shape[0])
        return ref.ref_linear(x, weight, bias)

    w = torch.randn(3, 4)
    kernels.install(Bucket("linear", ((4, 4), (3, 4)), "float32"), "marked", marked)
    kernels.dispatch("linear", torch.randn(3, 4), w)
    assert calls == []  # staged, not yet applied: the current step keeps the old table
    assert kernels.apply_pending() == 1
    assert kernels.installed() == {Bucket("linear", ((4, 4), (3, 4)), "float32"): "marked"}
    x3, x5 = torch.randn(3, 4), torch.randn(5, 4)
    torch.testing.assert_close(kernels.dispatch("linear", x3, w), x3 @ w.T)
    kernels.dispatch("linear", x5, w)  # bucket 8: the default
    kernels.dispatch("linear", torch.randn(4, 4, dtype=torch.bfloat16), w.bfloat16())  # another dtype: the default
    assert calls == [3]
    kernels.install(Bucket("linear", ((4, 4), (3, 4)), "float32"), "marked", None)
    kernels.apply_pending()
    kernels.dispatch("linear", x3, w)
    assert calls == [3] and kernels.installed() == {}


def test_step_variant_is_none_without_winner_and_the_winner_of_its_bucket():
    assert kernels.step_variant("decode_step", 3, torch.float32, "m") is None
    step = object()
    kernels.install(Bucket("decode_step", ((4,),), "float32", "m"), "fake", step)
    kernels.apply_pending()
    assert kernels.step_variant("decode_step", 3, torch.float32, "m") is step
    assert kernels.step_variant("decode_step", 5, torch.float32, "m") is None
    assert kernels.step_variant("decode_step", 3, torch.float32, "other") is None


def test_install_refuses_unknown_ops():
    with pytest.raises(KeyError, match="unknown op"):
        kernels.install(Bucket("conv", ((1,),), "float32"), "x", lambda: None)
