"""Weight-only int8/int4 linears (`kernels/quant_cpu.py`) against their dequantize-then-matmul references
(`kernels/ref_quant.py`), the quantization error bound, shape errors, and the pack cache."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import quant_cpu, ref_quant
from kernels.variants import Variant

# Packed kernel against the dequantize-then-F.linear reference, relative to the output's largest value:
# float32 differs only by summation order; bfloat16 by the kernel's bf16 rounding (2^-8 relative).
PARITY_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _assert_parity(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and out.shape == expected.shape
    scale = expected.float().abs().max().item()
    err = (out.float() - expected.float()).abs().max().item()
    assert err <= PARITY_TOLERANCE[dtype] * scale, (err, scale)


def test_int8_quantization_by_hand():
    w = torch.tensor([[1.0, -127 / 64, 32.5 / 64], [0.0, 0.0, 0.0], [0.25, 0.127, -0.0635]])
    q, scale = ref_quant.quantize_int8(w)
    # row 0: s = (127 / 64) / 127 = 1 / 64, q = round(64, -127, 32.5) = (64, -127, 32) (half to even);
    # row 1: all zero, s = 1; row 2: s = 0.25 / 127, q = round(127, 64.516, -32.258)
    assert q.tolist() == [[64, -127, 32], [0, 0, 0], [127, 65, -32]]
    torch.testing.assert_close(scale, torch.tensor([1 / 64, 1.0, 0.25 / 127]))


def test_int4_quantization_by_hand():
    # one row, one group of 32: values 0, 1, ..., 15 then 15 repeated; min 0, max 15 -> s = 1, z = 8
    w = torch.cat([torch.arange(16.0), torch.full((16,), 15.0)])[None, :].repeat(16, 1)
    q, scale, zero = ref_quant.quantize_int4(w, 32)
    assert q[0].tolist() == list(range(16)) + [15] * 16
    assert scale.flatten().tolist() == [1.0] * 16 and zero.flatten().tolist() == [8.0] * 16
    torch.testing.assert_close(ref_quant.dequantize_int4(q, scale, zero), w)


@pytest.mark.parametrize("shape", [(37, 53), (960, 576)])
def test_int8_error_within_half_a_step(shape):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    q, scale = ref_quant.quantize_int8(w)
    assert q.abs().max() <= 127
    err = (w - ref_quant.dequantize_int8(q, scale)).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_error_within_half_a_step(group_size):
    w = torch.randn(48, 384, generator=torch.Generator().manual_seed(2)) * 0.05
    q, scale, zero = ref_quant.quantize_int4(w, group_size)
    assert q.min() >= 0 and q.max() <= 15
    err = (w - ref_quant.dequantize_int4(q, scale, zero)).abs()
    step = scale.repeat_interleave(group_size, dim=1)
    assert (err <= step / 2 * (1 + 1e-5) + 1e-7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,out_features,in_features", [(1, 37, 208), (7, 960, 576), (5, 3, 48)])
def test_int8_linear_matches_reference(dtype, batch, out_features, in_features):
    gen = torch.Generator().manual_seed(batch + out_features)
    w = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    x = torch.randn(2, batch, in_features, generator=gen).to(dtype)  # 3-D: leading dims are flattened
    bias = torch.randn(out_features, generator=gen).to(dtype)
    _assert_parity(quant_cpu.int8_weight_linear(x, w, bias), ref_quant.ref_int8_weight_linear(x, w, bias), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,out_features,in_features,group_size", [(1, 48, 96, 32), (7, 960, 576, 64), (3, 208, 640, 128)])
def test_int4_linear_matches_reference(dtype, batch, out_features, in_features, group_size):
    gen = torch.Generator().manual_seed(batch + out_features)
    w = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    x = torch.randn(batch, in_features, generator=gen).to(dtype)
    out = quant_cpu.int4_linear(x, quant_cpu.pack_int4(w, group_size))
    _assert_parity(out, ref_quant.ref_int4_weight_linear(x, w, group_size=group_size), dtype)


def test_int4_variant_matches_reference_with_bias():
    w = torch.randn(48, 192) * 0.05
    x, bias = torch.randn(3, 192), torch.randn(48)
    expected = ref_quant.ref_int4_weight_linear(x, w, bias, group_size=quant_cpu.INT4_GROUP_SIZE)
    _assert_parity(quant_cpu.int4_weight_linear(x, w, bias), expected, torch.float32)


def test_quantized_linear_is_close_to_float():
    # Independent of the packing: the int8 output of a 0.05-scale weight is within the bound
    # sum_k |x_k| * s_n / 2 of the float output.
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(64, 96, generator=gen) * 0.05, torch.randn(4, 96, generator=gen)
    scale = w.abs().amax(dim=1) / 127
    bound = x.abs().sum(dim=1, keepdim=True) * scale[None, :] / 2
    assert ((quant_cpu.int8_weight_linear(x, w) - F.linear(x, w)).abs() <= bound * (1 + 1e-4)).all()


@pytest.mark.parametrize("shape,group_size,message", [
    ((40, 64), 32, "multiple of 16"),
    ((48, 80), 32, "multiple of the group size"),
    ((48, 96), 48, "group size must be one of"),
    ((48,), 32, "2-D"),
])
def test_int4_unsupported_shapes_raise(shape, group_size, message):
    with pytest.raises(ValueError, match=message):
        quant_cpu.pack_int4(torch.randn(*shape), group_size)


@pytest.mark.parametrize("batch,out_features,in_features", [(5, 37, 53), (3, 3, 1)])
def test_int8_linear_odd_in_features_in_float32(batch, out_features, in_features):
    gen = torch.Generator().manual_seed(in_features)
    w, x = torch.randn(out_features, in_features, generator=gen), torch.randn(batch, in_features, generator=gen)
    _assert_parity(quant_cpu.int8_weight_linear(x, w), ref_quant.ref_int8_weight_linear(x, w), torch.float32)


@pytest.mark.parametrize("in_features", [53, 200, 24])
def test_int8_linear_refuses_16_bit_activations_with_odd_in_features(in_features):
    # torch 2.13's kernel crashes the process there (K = 200 and 24 on an AMX CPU): the wrapper must raise first
    with pytest.raises(ValueError, match="% 16"):
        quant_cpu.int8_weight_linear(torch.randn(5, in_features, dtype=torch.bfloat16),
                                     torch.randn(37, in_features, dtype=torch.bfloat16))


def test_unsupported_activation_dtype_raises():
    with pytest.raises(ValueError, match="activations must be"):
        quant_cpu.int8_weight_linear(torch.ones(2, 4, dtype=torch.float64), torch.ones(3, 4))


def test_cache_packs_once_and_releases_with_the_weight():
    cache = quant_cpu.PackCache(quant_cpu.pack_int8)
    w, x = torch.randn(16, 32), torch.randn(2, 32)
    first = cache.get(w)
    for _ in range(3):
        assert cache.get(w) is first
    assert cache.num_packs == 1 and len(cache) == 1
    other = torch.randn(16, 32)
    cache.get(other)
    assert cache.num_packs == 2 and len(cache) == 2
    del w
    gc.collect()
    assert len(cache) == 1
    del other
    gc.collect()
    assert len(cache) == 0
    del x


def test_cache_repacks_after_in_place_change():
    cache = quant_cpu.PackCache(quant_cpu.pack_int8)
    w = torch.randn(16, 32)
    first = cache.get(w)
    w.mul_(2)
    second = cache.get(w)
    assert second is not first and cache.num_packs == 2
    torch.testing.assert_close(second.scale, first.scale * 2)


def test_cache_packs_once_under_threads():
    calls = []

    def slow_pack(weight):
        calls.append(1)
        threading.Event().wait(0.05)  # widen the window in which a second thread could also pack
        return quant_cpu.pack_int8(weight)

    cache = quant_cpu.PackCache(slow_pack)
    w = torch.randn(16, 32)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(w))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(r is results[0] for r in results)


def test_variant_functions_share_the_module_cache():
    w = torch.nn.Parameter(torch.randn(32, 64), requires_grad=False)
    before = quant_cpu.INT8_PACKS.num_packs
    for _ in range(3):
        quant_cpu.int8_weight_linear(torch.randn(1, 64), w)
    assert quant_cpu.INT8_PACKS.num_packs == before + 1


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_quantized_gated_mlp_matches_reference(activation):
    gen = torch.Generator().manual_seed(4)
    gate_up, down = torch.randn(96, 64, generator=gen) * 0.05, torch.randn(64, 48, generator=gen) * 0.05
    x = torch.randn(5, 64, generator=gen)
    act = F.silu if activation == "silu" else (lambda t: F.gelu(t, approximate="tanh"))
    gate, up = ref_quant.ref_int8_weight_linear(x, gate_up).chunk(2, dim=-1)
    expected = ref_quant.ref_int8_weight_linear(act(gate) * up, down)
    _assert_parity(quant_cpu.int8_weight_gated_mlp(x, gate_up, down, activation), expected, torch.float32)


def test_quantized_provider_variants_are_not_registered_at_import():
    from kernels.candidates import provider_variants
    from kernels.step_base import thread_candidates

    found = provider_variants("quantized")
    assert all(isinstance(v, Variant) and v.devices == ("cpu",) for v in found)
    kinds = ("int8_weight", "int4_weight", "int8_weight_a16", "int4_weight_a16")
    assert {(v.op, v.name) for v in found if v.op != "decode_step"} == {(op, k) for op in ("linear", "gated_mlp") for k in kinds}
    assert {v.name for v in found if v.op == "decode_step"} == {f"compile-w4a16-t{n}" for n in thread_candidates()}
    assert all(v.lossy for v in found if v.op == "decode_step")
    assert all(v.dtypes == (torch.float32,) for v in found if v.name.endswith("_a16"))
    assert all(set(v.tolerance) >= set(v.dtypes) for v in found)
    # what importing registers, in a fresh interpreter (earlier tests of this process may have opted in)
    check = ("import kernels.quant_cpu, kernels.compiled, kernels.cpu_linear\n"
             "from kernels.variants import variants\n"
             "assert not any('_weight' in v.name for op in ('linear', 'gated_mlp') for v in variants(op))\n"
             "assert not any('w4a16' in v.name for v in variants('decode_step'))\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stated_tolerances_accept_the_variants_and_reject_a_wrong_scale(dtype):
    # the tuner's check inputs, which the tolerances assume: x ~ N(0, 1), w ~ N(0, 1 / K)
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(960, 576, generator=gen) * 576**-0.5, torch.randn(16, 576, generator=gen)
    expected = F.linear(x, w)
    for fn, tolerance in ((quant_cpu.int8_weight_linear, quant_cpu.INT8_TOLERANCE),
                          (quant_cpu.int4_weight_linear, quant_cpu.INT4_TOLERANCE),
                          (quant_cpu.int8_weight_linear_a16, quant_cpu.INT8_TOLERANCE),
                          (quant_cpu.int4_weight_linear_a16, quant_cpu.INT4_TOLERANCE)):
        atol, rtol = tolerance[dtype]
        torch.testing.assert_close(fn(x.to(dtype), w.to(dtype)).float(), expected, atol=atol, rtol=rtol)
    pack = quant_cpu.pack_int8(w)
    wrong = quant_cpu.int8_linear(x.to(dtype), quant_cpu.Int8Pack(pack.q, pack.scale.roll(1))).float()
    atol, rtol = quant_cpu.INT8_TOLERANCE[dtype]
    assert not torch.allclose(wrong, expected, atol=atol, rtol=rtol)
    pack4 = quant_cpu.pack_int4(w)  # every zero one step too high
    scale, zero = pack4.scale_and_zero.unbind(-1)
    off = quant_cpu.Int4Pack(pack4.packed, torch.stack((scale, zero + scale), -1).contiguous(), pack4.group_size)
    atol, rtol = quant_cpu.INT4_TOLERANCE[dtype]
    assert not torch.allclose(quant_cpu.int4_linear(x.to(dtype), off).float(), expected, atol=atol, rtol=rtol)


def test_a16_linears_compute_the_float32_call_in_bfloat16():
    """W8A16 / W4A16 on float32 input: the 16-bit kernel on the input rounded to bfloat16, returned in
    float32 with the bias added there; equal to the plain variant called on bfloat16 input."""
    gen = torch.Generator().manual_seed(6)
    w, x, bias = torch.randn(64, 96, generator=gen) * 0.1, torch.randn(3, 96, generator=gen), torch.randn(64, generator=gen)
    for a16, plain in ((quant_cpu.int8_weight_linear_a16, quant_cpu.int8_weight_linear),
                       (quant_cpu.int4_weight_linear_a16, quant_cpu.int4_weight_linear)):
        out = a16(x, w, bias)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, plain(x.bfloat16(), w).float() + bias, atol=0, rtol=0)
        assert a16(x.bfloat16(), w).dtype == torch.bfloat16  # other dtypes pass through


def test_int4_groups_of_32_recover_gguf_q4_1_blocks():
    """GGUF Q4_1 (w = d * q + m per block of 32, the block's min at q = 0 and max at q = 15, d and m float16),
    written by hand with the format's own quantizer, dequantized, then packed: the same codes and weights."""
    gen = torch.Generator().manual_seed(7)
    original = torch.randn(16, 96, generator=gen)
    blocks = original.reshape(16, 3, 32)
    lo, hi = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = ((hi - lo) / 15).half().float()
    m = lo.half().float()
    codes = torch.round((blocks - m) / d).clamp(0, 15)
    file_weight = (d * codes + m).reshape(16, 96)        # what the GGUF reader gives the engine
    q, scale, zero = ref_quant.quantize_int4(file_weight, quant_cpu.INT4_GROUP_SIZE)
    assert quant_cpu.INT4_GROUP_SIZE == 32
    assert torch.equal(q.reshape(16, 3, 32).float(), codes)
    torch.testing.assert_close(ref_quant.dequantize_int4(q, scale, zero), file_weight, atol=1e-6, rtol=0)


def test_tuner_checks_quantized_variants_on_the_models_own_weights(tmp_path, monkeypatch):
    """Random check weights pack alike; a model's own may not. The same int4 variant passes on a model whose
    weight is a Q4_1-style block grid (0.3% error from the bfloat16 activations) and is rejected, logged with
    its relative error, on one with Gaussian weights (about 9%), over `MAX_RELATIVE_ERROR`."""
    import kernels
    import kernels.tuner as tuner_module
    from kernels.recorder import Bucket
    from kernels.tuner import Tuner
    from kernels.winners import WinnerTable

    int4 = next(v for v in quant_cpu.cpu_quant_variants() if (v.op, v.name) == ("linear", "int4_weight_a16"))
    monkeypatch.setattr(tuner_module, "variants", lambda op: [int4] if op == "linear" else [])
    gen = torch.Generator().manual_seed(8)
    gaussian = torch.randn(64, 96, generator=gen) * 0.05
    blocks = gaussian.reshape(64, 3, 32)
    lo, step = blocks.amin(-1, keepdim=True), (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 15
    on_grid = (lo + step * torch.round((blocks - lo) / step)).reshape(64, 96)
    bucket = Bucket("linear", ((4, 96), (64, 96)), "float32")
    verdicts = {}
    for name, weight in (("grid", on_grid), ("gaussian", gaussian)):
        model = torch.nn.Linear(96, 64, bias=False)
        model.weight = torch.nn.Parameter(weight, requires_grad=False)
        tuner = Tuner(WinnerTable(tmp_path / f"{name}.sqlite"), "m", model=model, allow_lossy=True, repeats=1, warmup=0)
        verdicts[name] = {r.variant: r for r in tuner.tune_bucket(bucket)}["int4_weight_a16"]
        kernels.reset()
    assert verdicts["grid"].status in ("passed", "winner")
    assert verdicts["gaussian"].status == "rejected" and "relative error" in verdicts["gaussian"].message
    assert float(verdicts["gaussian"].message.split()[2]) > quant_cpu.MAX_RELATIVE_ERROR
