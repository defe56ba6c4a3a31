"""GGUF -> Hugging Face layout details: tensor names and llama.cpp's q/k row permutation."""

from __future__ import annotations

import pytest
import torch

from serving.errors import ModelFileError
from serving.loader.gguf_loader import hf_tensor_name, unpermute_rope_rows


def _llama_cpp_permute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    # The converter's permutation (half-split -> interleaved pairs), written from its definition:
    # row (h, i, half) of the HF weight moves to row (h, 2 * i + half).
    rows, cols = w.shape
    head_dim = rows // num_heads
    out = torch.empty_like(w)
    for h in range(num_heads):
        for half in range(2):
            for i in range(head_dim // 2):
                out[h * head_dim + 2 * i + half] = w[h * head_dim + half * head_dim // 2 + i]
    return out


def test_unpermute_inverts_the_converter_permutation():
    w = torch.randn(3 * 8, 5)
    assert torch.equal(unpermute_rope_rows(_llama_cpp_permute(w, 3), 3), w)


@pytest.mark.parametrize("gguf,arch,hf", [
    ("token_embd.weight", "llama", "model.embed_tokens.weight"),
    ("blk.4.attn_q.weight", "llama", "model.layers.4.self_attn.q_proj.weight"),
    ("blk.0.ffn_norm.weight", "llama", "model.layers.0.post_attention_layernorm.weight"),
    ("blk.0.ffn_norm.weight", "gemma3", "model.layers.0.pre_feedforward_layernorm.weight"),
    ("blk.17.post_ffw_norm.weight", "gemma3", "model.layers.17.post_feedforward_layernorm.weight"),
    ("blk.2.attn_k_norm.weight", "gemma3", "model.layers.2.self_attn.k_norm.weight"),
    ("output.weight", "llama", "lm_head.weight"),
])
def test_tensor_names(gguf, arch, hf):
    assert hf_tensor_name(gguf, arch) == hf


def test_unknown_tensor_name_is_an_error():
    with pytest.raises(ModelFileError, match="unexpected tensor 'blk.0.attn_qkv.weight'"):
        hf_tensor_name("blk.0.attn_qkv.weight", "llama")
