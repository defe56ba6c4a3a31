"""`GGUFCheckpoint.tensors(packed=True)` into a model: a tiny Llama GGUF written here with every block type, loaded
packed and float; the packed model holds blocks where the file has them and computes the float model's logits.

    .venv/bin/python -m pytest -q tests/serving/loader/test_gguf_packed.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter

from kernels.gguf_weight import GGUFWeight
from kernels.step_base import is_llama_like
from serving.loader.gguf_loader import open_gguf
from serving.models import build_model
from tests.kernels.gguf_blocks import random_blocks

E, F, V, HEADS, KV_HEADS = 256, 512, 97, 4, 2
# per layer: GGUF tensor -> ggml type (q/k Q4_K with v Q6_K as in the Qwen files; gate/up of two types in layer 1)
LAYER_TYPES = [
    {"attn_q": 12, "attn_k": 12, "attn_v": 14, "attn_output": 7, "ffn_gate": 13, "ffn_up": 13, "ffn_down": 3},
    {"attn_q": 8, "attn_k": 8, "attn_v": 8, "attn_output": 2, "ffn_gate": 6, "ffn_up": 8, "ffn_down": 14},
]
SHAPES = {"attn_q": (E, E), "attn_k": (E // 2, E), "attn_v": (E // 2, E), "attn_output": (E, E),
          "ffn_gate": (F, E), "ffn_up": (F, E), "ffn_down": (E, F)}  # torch order [N, K]


def write_tiny_llama(path, tied: bool) -> None:
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(len(LAYER_TYPES))
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_context_length(256)
    w.add_vocab_size(V)
    rng, seed = np.random.default_rng(0), 0

    def blocks(name, ggml_type, shape):
        nonlocal seed
        seed += 1
        w.add_tensor(name, random_blocks(ggml_type, *shape, seed=seed).numpy(), raw_dtype=GGMLQuantizationType(ggml_type))

    blocks("token_embd.weight", 8, (V, E))
    for i, types in enumerate(LAYER_TYPES):
        for stem, ggml_type in types.items():
            blocks(f"blk.{i}.{stem}.weight", ggml_type, SHAPES[stem])
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(E)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(E, dtype=np.float32))
    if not tied:
        blocks("output.weight", 14, (V, E))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "own-lm-head"])
def models(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama(path, tied=request.param)
    ckpt = open_gguf(path)
    dense, packed = build_model(ckpt.config, torch.float32), build_model(ckpt.config, torch.float32)
    dense.load_weights(ckpt.tensors())
    packed.load_weights(ckpt.tensors(packed=True))
    return dense, packed


def test_packed_model_holds_the_files_blocks(models):
    dense, packed = models
    attn, mlp = packed.layers[0].self_attn, packed.layers[0].mlp
    assert attn.qkv_proj.ggml_types == [12, 14] and mlp.gate_up_proj.ggml_types == [13] and mlp.down_proj.ggml_types == [3]
    assert packed.layers[1].mlp.gate_up_proj.ggml_types == [6, 8]
    assert isinstance(packed.embed_tokens.weight, GGUFWeight) and packed.embed_tokens.weight.ggml_types == [8]
    assert (packed.lm_head is None) == (dense.lm_head is None)
    # only the norms stay float parameters; the rest are blocks, each counted once
    assert {name.rsplit(".", 1)[0].rsplit(".", 1)[-1] for name, _ in packed.named_parameters()} == {
        "input_layernorm", "post_attention_layernorm", "norm"}
    assert len(packed.packed_weights()) == 1 + 4 * len(LAYER_TYPES) + (packed.lm_head is not None)


def test_packed_weights_decode_to_the_float_ones_permuted_rows_included(models):
    dense, packed = models
    for d_layer, p_layer in zip(dense.layers, packed.layers):
        for name in ("qkv_proj", "o_proj"):
            assert torch.equal(getattr(p_layer.self_attn, name).dequantize(), getattr(d_layer.self_attn, name))
        for name in ("gate_up_proj", "down_proj"):
            assert torch.equal(getattr(p_layer.mlp, name).dequantize(), getattr(d_layer.mlp, name))
    assert torch.equal(packed.embed_tokens.weight.dequantize(), dense.embed_tokens.weight)


def test_packed_logits_equal_the_float_models(models):
    dense, packed = models
    ids = torch.randint(0, V, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    want, got = dense.prefill_logits(ids), packed.prefill_logits(ids)
    assert got.shape == (11, V) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))


def test_whole_step_variants_refuse_a_packed_model(models):
    dense, packed = models
    assert is_llama_like(dense) and not is_llama_like(packed)
