"""`kernels.compiled`: the torch.compile variants against the references, and greedy fp32 outputs of the
real SmolLM2-135M-Instruct unchanged when the compiled decode step serves its decode batches.

Compilation takes tens of seconds on a 2-core CPU, so these are few: one op variant on odd shapes, one
real-model run (batch bucket 2; the padded path, batch 3 in bucket 4, is checked by the tuner's cases)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import ref
from kernels.compiled import CompiledDecodeStep, register_compiled_variants, supports
from kernels.recorder import Bucket
from kernels.variants import get_variant
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
    assert supports(smollm2.loaded.model)
    params = SamplingParams(temperature=0, max_tokens=12)
    prompts = real_prompts[:2]
    torch.set_num_threads(1)
    eager = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    step = CompiledDecodeStep(smollm2.loaded.model, num_threads=1)
    calls = []

    def counted(*args):
        calls.append(args[1].shape[0])
        return step(*args)

    for size in (1, 2):
        kernels.install(Bucket("decode_step", ((size,),), "float32", MODEL), "compile-t1", counted)
    compiled = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params)]
    assert calls and set(calls) <= {1, 2}  # the decode steps ran compiled
    assert compiled == eager
    assert len(eager[0]) == 12
