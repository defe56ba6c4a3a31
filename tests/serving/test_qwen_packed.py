"""Qwen2.5-Coder-0.5B-Instruct loaded packed (its GGUF blocks kept, `weights="packed"`) against the same file loaded
float: the same greedy tokens, logits within 1e-3, and resident weights about the file's size instead of 4x it.

Without the C++ GGUF module the packed model computes on the PyTorch reference, which decodes every weight on every
call (about 8 s a forward pass on a 2-core CPU): the runs here are kept short.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/serving/test_qwen_packed.py
"""

from __future__ import annotations

import pytest
import torch

from serving import LLM, SamplingParams
from serving.engine.engine_config import EngineConfig
from serving.loader.gguf_loader import open_gguf

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-0.5b-instruct"
PROMPTS = ["def fibonacci(n):", "The capital of France is"]
NUM_NEW_TOKENS = 16
CONFIG = EngineConfig(kv_cache_bytes=16 * 2**20)


@pytest.fixture(scope="module")
def dense():
    return LLM(MODEL, dtype="float32", weights="float", engine_config=CONFIG)


@pytest.fixture(scope="module")
def packed():
    return LLM(MODEL, dtype="bfloat16", weights="packed", engine_config=CONFIG)  # bf16 asked: float32 used


def test_packed_model_keeps_the_blocks_and_float32_activations(packed, dense):
    loaded = packed.loaded
    assert loaded.weights == "packed" and dense.loaded.weights == "float" and loaded.dtype == torch.float32
    qkv = loaded.model.layers[0].self_attn.qkv_proj
    assert qkv.shape == dense.loaded.model.layers[0].self_attn.qkv_proj.shape and set(qkv.ggml_types) <= {6, 8, 12, 14}
    file_bytes = open_gguf(loaded.spec.resolve_path()).num_bytes
    assert loaded.resident_bytes <= 1.15 * file_bytes, (loaded.resident_bytes, file_bytes)
    assert dense.loaded.resident_bytes > 3 * file_bytes  # float32: the comparison that matters


def test_packed_logits_match_the_float_model(packed, dense):
    ids = packed.tokenizer.encode(PROMPTS[0])
    want = dense.loaded.model.prefill_logits(ids)
    got = packed.loaded.model.prefill_logits(ids)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_packed_greedy_tokens_match_the_float_model(packed, dense):
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    want = [out.outputs[0].token_ids for out in dense.generate(PROMPTS, params)]
    got = [out.outputs[0].token_ids for out in packed.generate(PROMPTS, params)]
    assert all(len(tokens) == NUM_NEW_TOKENS for tokens in want)
    assert [list(t) for t in got] == [list(t) for t in want]
