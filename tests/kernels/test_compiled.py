"""`kernels.compiled`: the torch.compile variants against the references, and greedy fp32 outputs of the
real SmolLM2-135M-Instruct unchanged when the compiled decode step serves its decode batches.

Compilation takes tens of seconds on a 2-core CPU, so these are few: one op variant on odd shapes, one
real-model run (batch bucket 2; the padded path, batch 3 in bucket 4, is checked by the tuner's cases),
and the warm-up contract with real Dynamo: what a step calls after `kernels.warmup.install_warm`
compiles nothing."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import kernels
from kernels import ref
from kernels.compiled import CompiledOp, _CompiledStepVariant, register_compiled_variants, supports
from kernels.recorder import Bucket
from kernels.variants import Variant, get_variant
from kernels.warmup import install_warm
from serving import SamplingParams

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.usefixtures("clean_dispatch")


def test_compiled_rms_norm_matches_reference_on_odd_shapes():
    register_compiled_variants()
    variant = get_variant("rms_norm", "compile")
    atol, rtol = variant.tolerance[torch.float32]  # (1e-5, 1e-5)
    for rows, size, offset in ((3, 37, 0.0), (11, 37, 1.0)):
        x, w = torch.randn(rows, size), torch.randn(size)
        torch.testing.assert_close(variant.fn(x, w, 1e-6, offset=offset), ref.ref_rms_norm(x, w, 1e-6, offset=offset), atol=atol, rtol=rtol)


@pytest.mark.slow
def test_compiled_decode_step_keeps_greedy_fp32_outputs(smollm2, real_prompts):
    model = smollm2.loaded.model
    assert supports(model)
    params = SamplingParams(temperature=0, max_tokens=12)
    prompts = real_prompts[:2]
    torch.set_num_threads(1)
    eager = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    variant = Variant("decode_step", "compile-t1", _CompiledStepVariant(1, compiled=True))
    calls = []
    for size in (1, 2):
        bucket = Bucket("decode_step", ((size,),), "float32", MODEL)
        serve = install_warm(bucket, variant, model)  # compiled here, for the bucket's padded size

        def counted(*args, serve=serve):
            calls.append(args[1].shape[0])
            return serve(*args)

        kernels.install(bucket, "compile-t1", counted)
    graphs = counters["stats"]["unique_graphs"]
    compiled = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    assert calls and set(calls) <= {1, 2}  # the decode steps ran compiled
    assert counters["stats"]["unique_graphs"] == graphs  # and nothing was compiled inside a step
    assert compiled == eager
    assert len(eager[0]) == 12


def test_compiled_rotary_warmed_up_serves_the_engine_layout_without_compiling():
    """The rotary winner of a prefill bucket, warmed up on the tuner's cases, serves q/k as the engine
    passes them (a strided view of the fused QKV output) from compiled code: no compilation at serving
    time, where one compilation took seconds inside served requests (issue 9)."""
    op = CompiledOp(ref.ref_rotary)
    install_warm(Bucket("rotary", ((512, 12, 64),), "float32"), Variant("rotary", "compile", op))
    graphs = counters["stats"]["unique_graphs"]
    qkv = torch.randn(300, 15 * 64)
    q_k = qkv[:, : 12 * 64].view(300, 12, 64)
    cos, sin = ref.ref_rotary_cos_sin(torch.arange(300), 64, 10000.0, torch.float32)
    kernels.apply_pending()
    with torch.inference_mode():
        out = kernels.dispatch("rotary", q_k, cos, sin)
    torch.testing.assert_close(out, ref.ref_rotary(q_k, cos, sin), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs


def _prompt_ids(loaded, prompts: list[str]) -> list[list[int]]:
    return [loaded.tokenizer.encode(loaded.chat_format.render([{"role": "user", "content": p}])) for p in prompts]


@pytest.mark.slow
def test_step_cases_on_prompts_decode_from_the_eager_prefill(smollm2_fp32, real_prompts):
    """A decode-step case built on real prompts holds the eager model's K/V of each prompt and decodes its
    greedy next token: the step's logits are the last row of the whole sequence's own forward pass."""
    from kernels.tuner_inputs import step_cases

    model = smollm2_fp32.model
    prompts = _prompt_ids(smollm2_fp32, real_prompts[:3])
    (args, _), *_ = step_cases(model, 3, prompts=prompts)
    _, token_ids, batch, cache = args
    with torch.inference_mode():
        logits = model.compute_logits(model(token_ids, batch, cache))
        for b, prompt in enumerate(prompts):
            whole = model.prefill_logits(prompt + [int(token_ids[b])])
            assert int(token_ids[b]) == int(model.prefill_logits(prompt)[-1].argmax())
            torch.testing.assert_close(logits[b], whole[-1], atol=2e-4, rtol=1e-4)


@pytest.mark.slow
def test_w4a16_decode_step_packs_the_q4_1_file_exactly_and_stays_within_its_tolerance(smollm2_fp32, real_prompts):
    """SmolLM2's projections come from GGUF Q4_1 (blocks of 32): packed to int4 in groups of 32 they are the
    file's weights exactly, so the W4A16 step differs from the float32 step only by bfloat16 activations.
    Run without compiling (its regions' eager form: same math, no compile time) on real prompts."""
    from kernels.compiled import W4A16_STEP_TOLERANCE, CompiledDecodeStep, quantized_step_variants
    from kernels.quant_cpu import INT4_GROUP_SIZE
    from kernels.ref_quant import quantize_int4
    from kernels.step_check import check_step_logits
    from kernels.tuner_inputs import step_cases

    model = smollm2_fp32.model
    layer = model.layers[7]
    for weight in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        q, scale, zero = quantize_int4(weight, INT4_GROUP_SIZE)
        restored = (q.float() - 8) * scale.repeat_interleave(INT4_GROUP_SIZE, 1) + zero.repeat_interleave(INT4_GROUP_SIZE, 1)
        assert torch.equal(restored, weight)
    assert all(v.lossy for v in quantized_step_variants())
    step = CompiledDecodeStep(model, torch.get_num_threads(), weights="w4a16")
    atol, rtol = W4A16_STEP_TOLERANCE[torch.float32]
    for (args, _) in step_cases(model, 4, prompts=_prompt_ids(smollm2_fp32, real_prompts)):
        m, token_ids, batch, cache = args
        with torch.inference_mode():
            expected = model.compute_logits(m(token_ids, batch, _clone(cache)))
            got = model.compute_logits(step.run(m, token_ids, batch, _clone(cache)))
        error, max_error = check_step_logits(expected, got, atol, rtol, near_ties=True)
        assert error is None
        relative = ((got - expected).abs().amax(-1) / expected.abs().amax(-1)).max()
        assert 1e-4 < relative < 0.02  # bfloat16 activations move the logits (by ~0.4-1.2% measured), int4 no further


def _clone(cache):
    from kernels.tuner import _clone_cache

    return _clone_cache(cache)
