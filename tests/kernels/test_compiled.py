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
from kernels.compiled import CompiledOp, _PerModel, register_compiled_variants, supports
from kernels.recorder import Bucket
from kernels.variants import Variant, get_variant
from kernels.warmup import install_warm
from serving import SamplingParams

MODEL = "smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def clean_dispatch():
    threads = torch.get_num_threads()
    kernels.reset()
    yield
    kernels.reset()
    torch.set_num_threads(threads)


def test_compiled_rms_norm_matches_reference_on_odd_shapes():
    register_compiled_variants()
    variant = get_variant("rms_norm", "compile")
    atol, rtol = variant.tolerance[torch.float32]  # (1e-5, 1e-5)
    for rows, size, offset in ((3, 37, 0.0), (11, 37, 1.0)):
        x, w = torch.randn(rows, size), torch.randn(size)
        torch.testing.assert_close(variant.fn(x, w, 1e-6, offset=offset), ref.ref_rms_norm(x, w, 1e-6, offset=offset), atol=atol, rtol=rtol)


def test_compiled_decode_step_keeps_greedy_fp32_outputs(smollm2, real_prompts):
    model = smollm2.loaded.model
    assert supports(model)
    params = SamplingParams(temperature=0, max_tokens=12)
    prompts = real_prompts[:2]
    torch.set_num_threads(1)
    eager = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    variant = Variant("decode_step", "compile-t1", _PerModel(1, compiled=True))
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
