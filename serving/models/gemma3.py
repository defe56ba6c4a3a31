"""Gemma 3 (text): interleaved sliding-window and global attention layers.

Gemma Team 2025, "Gemma 3 Technical Report", arXiv:2503.19786. What differs from Llama:
- embeddings are scaled by sqrt(E) (in the activation dtype);
- RMSNorm scales by (1 + w), and there are four norms per layer (before and after attention and MLP);
- per-head RMSNorm of queries and keys before RoPE;
- attention scale query_pre_attn_scalar ** -0.5;
- 5 of every 6 layers attend to a sliding window of W tokens with RoPE base 10,000; every 6th layer is
  global with RoPE base 1,000,000 (linearly scaled on the larger models);
- GeGLU MLP with the tanh approximation of GELU.
Weight names follow Hugging Face's Gemma3ForCausalLM.
"""

from __future__ import annotations

import torch
from torch import nn

from serving.config import ModelConfig
from serving.engine.paged_cache import BatchMetadata, PagedKVCache
from serving.models.base import CausalLM
from serving.models.layers import Attention, GatedMLP, RMSNorm, rope_tables


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.is_sliding = cfg.is_sliding(layer)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, offset=1.0)
        self.self_attn = Attention(cfg, layer, qk_norm_offset=1.0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps, offset=1.0)
        self.mlp = GatedMLP(cfg, "gelu_tanh")
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps, offset=1.0)

    def forward(self, x, ropes, batch, cache):
        rope = ropes[self.is_sliding]
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, batch, cache))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)

    def forward(self, token_ids: torch.Tensor, batch: BatchMetadata, cache: PagedKVCache) -> torch.Tensor:
        cfg = self.config
        x = self.embed_tokens(token_ids)
        x = x * torch.tensor(cfg.hidden_size**0.5).to(x.dtype)  # rounded via float32, as in the reference
        ropes = {
            False: rope_tables(batch.positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor, x.dtype),
            True: rope_tables(batch.positions, cfg.head_dim, cfg.rope_local_theta or cfg.rope_theta, 1.0, x.dtype),
        }
        for layer in self.layers:
            x = layer(x, ropes, batch, cache)
        return self.norm(x)
