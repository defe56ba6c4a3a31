"""Llama (and SmolLM2, Qwen2): pre-norm decoder, grouped-query attention with RoPE, SwiGLU MLP.

Touvron et al. 2023, arXiv:2302.13971. Weight names follow Hugging Face's LlamaForCausalLM.
Qwen2 (Qwen Team 2024, arXiv:2407.10671) is this model with biases on the q/k/v projections
(`ModelConfig.qkv_bias`) and its own LM head where the checkpoint has one (`tie_word_embeddings`).
"""

from __future__ import annotations

import torch
from torch import nn

from serving.config import ModelConfig
from serving.engine.paged_cache import BatchMetadata, PagedKVCache
from serving.models.base import CausalLM
from serving.models.layers import Attention, GatedMLP, RMSNorm, rope_tables


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg, "silu")

    def forward(self, x, rope, batch, cache):
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, token_ids: torch.Tensor, batch: BatchMetadata, cache: PagedKVCache) -> torch.Tensor:
        cfg = self.config
        x = self.embed_tokens(token_ids)
        rope = rope_tables(batch.positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, batch, cache)
        return self.norm(x)
