"""Qwen2 (Llama with q/k/v biases) against Hugging Face's Qwen2ForCausalLM on a tiny random model.

The checkpoint is written by `transformers` itself (config.json model_type "qwen2", safetensors), read back
by our safetensors loader, and the logits of both models compared in fp32. The real GGUF files are checked
in `test_parity_qwen.py` (slow).
"""

from __future__ import annotations

import pytest
import torch

from serving.config import ModelConfig
from serving.loader.hf_export import hf_config
from serving.loader.safetensors_loader import open_safetensors
from serving.models import build_model

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=256, rope_theta=1_000_000.0, rms_norm_eps=1e-6)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "own-lm-head"])
def tiny_qwen2(request, tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=request.param)).float().eval()
    with torch.no_grad():  # random biases: the default init sets them to 0, which would hide a dropped bias
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    folder = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(str(folder), safe_serialization=True)
    return hf, folder


def test_config_reads_qwen2(tiny_qwen2):
    hf, folder = tiny_qwen2
    cfg = open_safetensors(folder).config
    assert (cfg.architecture, cfg.qkv_bias, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("qwen2", True, 6, 2, 10)  # head_dim = 64 // 6: q is 60 wide, not E
    assert cfg.rope_theta == 1_000_000.0 and cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert ModelConfig.from_hf_config(hf_config(cfg, None, None)) == cfg


def test_logits_match_transformers(tiny_qwen2):
    hf, folder = tiny_qwen2
    ckpt = open_safetensors(folder)
    ours = build_model(ckpt.config, torch.float32)
    ours.load_weights(ckpt.tensors())
    assert (ours.lm_head is None) == hf.config.tie_word_embeddings
    ids = torch.randint(0, TINY["vocab_size"], (37,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours.prefill_logits(ids), ref, atol=1e-4, rtol=1e-4)


def test_dropping_the_bias_changes_the_logits(tiny_qwen2):
    """The biases matter on this model, so the parity above checks that they are applied."""
    hf, folder = tiny_qwen2
    ckpt = open_safetensors(folder)
    ours = build_model(ckpt.config, torch.float32)
    ours.load_weights(ckpt.tensors())
    ids = list(range(20))
    before = ours.prefill_logits(ids)
    for layer in ours.layers:
        layer.self_attn.qkv_bias.data.zero_()
    assert (ours.prefill_logits(ids) - before).abs().max() > 1e-2


@pytest.mark.parametrize("name, num_layers, hidden, heads, kv_heads", [
    ("qwen2.5-coder-0.5b-instruct", 24, 896, 14, 2),
    ("qwen2.5-coder-1.5b-instruct", 28, 1536, 12, 2),
])
def test_registered_qwen_files_hold_qwen2(name, num_layers, hidden, heads, kv_heads):
    """The default registry's entries resolve to the assembled files (published shapes, own LM head)."""
    from serving.loader.gguf_loader import open_gguf
    from serving.registry import default_registry

    spec = default_registry().get(name)
    cfg = open_gguf(spec.resolve_path()).config
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == ("qwen2", num_layers, hidden, heads, kv_heads)
    assert (cfg.vocab_size, cfg.rope_theta, cfg.context_length, cfg.tie_word_embeddings, cfg.qkv_bias) == (151936, 1e6, 32768, False, True)
    assert spec.context_length == cfg.context_length and spec.chat_format == "template"
