"""`kernels.native_step`: the C++ decode step and its GGUF-block projections against independent references.

- packing: blocks built from known codes are recovered exactly (codes, scales, offsets); a weight that is
  not such blocks is not packed;
- projections (float32, Q4_1- and Q8_0-style) against a float64 matmul on the dequantized weight, for row
  counts across the 4-row groups and N not a multiple of the tile;
- the whole step on the real SmolLM2-135M-Instruct (the GGUF Q4_1 file dequantized to float32) against the
  eager model: logits within the step tolerance with the same greedy tokens, the cache's new K/V equal,
  on real prompts and on random cached K/V over a shuffled block table; greedy generation unchanged
  with the step serving the engine's decode batches.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.native import load_decode_step
from kernels.recorder import Bucket
from kernels.step_check import STEP_TOLERANCE, check_step_logits
from serving import SamplingParams

pytestmark = [pytest.mark.skipif(load_decode_step() is None, reason="the C++ step needs AVX-512 and a compiler"),
              pytest.mark.usefixtures("clean_dispatch")]

MODEL = "smollm2-135m-instruct"


def _q4_weight(n: int, k: int, gen: torch.Generator):
    """A weight that is exactly Q4_1 blocks: codes with 0 and 15 in every block (as ggml's quantizer gives)."""
    q = torch.randint(0, 16, (n, k // 32, 32), generator=gen)
    q[..., 3], q[..., 17] = 0, 15
    d = torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3
    m = torch.randn(n, k // 32, generator=gen) * 0.1
    return (d[..., None] * q + m[..., None]).reshape(n, k), q, d, m


def _q8_weight(n: int, k: int, gen: torch.Generator):
    q = torch.randint(-127, 128, (n, k // 32, 32), generator=gen)
    q[..., 5] = 127
    d = torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-4
    return (d[..., None] * q).reshape(n, k), q, d


def test_pack_q4_recovers_the_blocks_codes_and_refuses_other_weights():
    from kernels.native_step import pack_q4

    gen = torch.Generator().manual_seed(0)
    weight, q, d, m = _q4_weight(7, 96, gen)
    codes, d_packed, m_packed = pack_q4(weight)
    unpacked = torch.stack((codes & 0xF, codes >> 4), dim=-1)  # [N, K / 2, 2]: elements i and i + 16 of a block
    unpacked = unpacked.reshape(7, 3, 16, 2).transpose(-1, -2).reshape(7, 3, 32)
    assert torch.equal(unpacked.long(), q)
    torch.testing.assert_close(d_packed, d, atol=0, rtol=1e-5)
    torch.testing.assert_close(m_packed, m, atol=1e-7, rtol=0)
    assert pack_q4(torch.randn(7, 96, generator=gen)) is None  # 32 distinct values per block: not 16 levels
    assert pack_q4(torch.randn(7, 90)) is None  # K not a multiple of 32


def test_pack_q8_recovers_the_blocks_codes_and_refuses_other_weights():
    from kernels.native_step import pack_q8

    gen = torch.Generator().manual_seed(1)
    weight, q, d = _q8_weight(5, 64, gen)
    codes, d_packed = pack_q8(weight)
    assert torch.equal(codes.long().reshape(5, 2, 32), q)
    torch.testing.assert_close(d_packed, d, atol=0, rtol=1e-6)
    assert pack_q8(torch.randn(5, 64, generator=gen)) is None


@pytest.mark.parametrize("kind", ["float", "q4", "q8"])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
def test_projection_matches_a_float64_matmul(kind, rows):
    from kernels.native_step import projection

    gen = torch.Generator().manual_seed(rows)
    n, k = 37, 96  # 37: not a multiple of the 4- or 2-row tiles
    if kind == "float":
        weight = torch.randn(n, 77, generator=gen)  # K with a masked tail
    else:
        weight = (_q4_weight if kind == "q4" else _q8_weight)(n, k, gen)[0]
    proj = projection(weight, "gguf")
    assert proj.kind == kind and proj.shape == tuple(weight.shape)
    x = torch.randn(rows, weight.shape[1], generator=gen)
    expected = (x.double() @ weight.double().T).float()
    torch.testing.assert_close(proj(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(proj(x[:0]), expected[:0])


def test_projection_float_weights_need_float32():
    from kernels.native_step import projection

    with pytest.raises(ValueError, match="float32"):
        projection(torch.randn(8, 64, dtype=torch.bfloat16), "float")
    with pytest.raises(ValueError, match="x must be float32"):
        projection(torch.randn(8, 64), "float")(torch.randn(2, 63))


def _prompt_ids(loaded, prompts: list[str]) -> list[list[int]]:
    return [loaded.tokenizer.encode(loaded.chat_format.render([{"role": "user", "content": p}])) for p in prompts]


def _clone(cache):
    from kernels.tuner import _clone_cache

    return _clone_cache(cache)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["float", "gguf"])
def test_native_step_matches_the_eager_step_on_smollm2(smollm2_fp32, real_prompts, weights):
    """Real prompts (batches of 1, 3 and 5, the smaller sizes of each case too) and random cached K/V over a
    shuffled block table (batch 4): logits within the float32 step tolerance, greedy tokens equal, and the
    new tokens' K/V written where the eager step writes them."""
    from kernels.native_step import NativeDecodeStep
    from kernels.tuner_inputs import step_cases

    model = smollm2_fp32.model
    step = NativeDecodeStep(model, weights)
    assert set(step.formats) == ({"float"} if weights == "float" else {"q4"})  # every Q4_1 layer packed
    cases = [c for b in (1, 3, 5) for c in step_cases(model, b, prompts=_prompt_ids(smollm2_fp32, real_prompts))]
    cases += step_cases(model, 4)
    for (args, _) in cases:
        m, token_ids, batch, cache = args
        eager_cache, native_cache = _clone(cache), _clone(cache)
        with torch.inference_mode():
            expected = model.compute_logits(m(token_ids, batch, eager_cache))
            got = model.compute_logits(step(m, token_ids, batch, native_cache))
        error, max_error = check_step_logits(expected, got, *STEP_TOLERANCE[torch.float32])
        assert error is None, error
        assert max_error > 0  # a different summation order, not the eager code path
        for layer in (0, 17, 29):
            for ours, theirs in ((native_cache.keys[layer], eager_cache.keys[layer]),
                                 (native_cache.values[layer], eager_cache.values[layer])):
                # float32 drift through up to 30 layers (2.6e-4 at most measured); a wrong slot, head or
                # rotation moves K/V by O(1)
                torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-3)


@pytest.mark.slow
def test_native_step_rejects_what_it_cannot_run(smollm2_fp32, gemma3):
    from kernels.native_step import NativeDecodeStep
    from kernels.tuner_inputs import step_cases

    with pytest.raises(ValueError, match="unknown weight format"):
        NativeDecodeStep(smollm2_fp32.model, "int3")
    with pytest.raises(ValueError, match="Llama-family"):
        NativeDecodeStep(gemma3.loaded.model, "float")  # sliding windows and q/k norms
    model = smollm2_fp32.model
    step = NativeDecodeStep(model, "float")
    (args, _), *_ = step_cases(model, 2)
    m, token_ids, batch, cache = args
    lens = list(batch.seq_lens)
    batch.seq_lens = [lens[0] + 10 * cache.block_size, lens[1]]
    with pytest.raises(ValueError, match="needs more blocks"):
        step(m, token_ids, batch, _clone(cache))
    batch.seq_lens = lens
    batch.block_tables = batch.block_tables.clone()
    batch.block_tables[1, 0] = cache.keys[0].shape[0]  # one past the last block
    with pytest.raises(ValueError, match="outside the cache"):
        step(m, token_ids, batch, _clone(cache))


@pytest.mark.slow
def test_every_thread_count_shares_one_step_per_model_and_format(smollm2_fp32):
    from kernels.native_step import native_variants, step_for

    model = smollm2_fp32.model
    assert step_for(model, "float") is step_for(model, "float")
    assert step_for(model, "float") is not step_for(model, "gguf")
    steps = {v.fn.weights for v in native_variants() if v.op == "decode_step"}
    assert steps == {"float", "gguf"}


@pytest.mark.slow
def test_greedy_generation_is_unchanged_with_the_native_step_serving(smollm2, real_prompts):
    """The engine's decode batches (1 and 2 sequences) through "native-gguf-t1" and the LM head through
    "native-gguf": the same greedy tokens as the eager engine (the model here is the engine's own)."""
    from kernels.native_step import native_variants

    params = SamplingParams(temperature=0, max_tokens=16)
    prompts = real_prompts[:2]
    eager = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    variants = {(v.op, v.name): v for v in native_variants()}
    calls = []

    def counted(*args):
        calls.append(args[1].shape[0])
        return variants[("decode_step", "native-gguf-t1")].fn(*args)

    for size in (1, 2):
        kernels.install(Bucket("decode_step", ((size,),), "float32", MODEL), "native-gguf-t1", counted)
    head = smollm2.loaded.model.embed_tokens.weight
    kernels.install(Bucket("linear", ((1, head.shape[1]), tuple(head.shape)), "float32"), "native-gguf", variants[("linear", "native-gguf")].fn)
    kernels.install(Bucket("linear", ((2, head.shape[1]), tuple(head.shape)), "float32"), "native-gguf", variants[("linear", "native-gguf")].fn)
    native = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    assert calls and set(calls) <= {1, 2}
    assert native == eager
    assert len(eager[0]) == 16


def test_a_killed_builds_lock_is_cleared_and_a_live_one_kept(tmp_path, monkeypatch):
    """torch's extension loader waits on the build directory's lock forever: one older than a build can
    take is a killed build's and is removed; a recent one (a build running now) is left alone."""
    import os
    import time

    from kernels.native import STALE_LOCK_S, _clear_stale_lock

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "link_demo" / "lock"
    lock.parent.mkdir()
    lock.touch()
    _clear_stale_lock("link_demo")
    assert lock.exists()
    old = time.time() - STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    _clear_stale_lock("link_demo")
    assert not lock.exists()
    _clear_stale_lock("link_demo")  # no lock: nothing to do
