"""Building blocks shared by the model architectures: RMSNorm, attention, gated MLP.

Every hot operation goes through `kernels.dispatch`, so tuned kernels replace the PyTorch references
without touching this code. Projections are fused (q/k/v into one matrix, gate/up into another) so a
decode step runs two matmuls where the checkpoint has five.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import dispatch
from kernels.gguf_weight import GGUFWeight
from serving.config import ModelConfig
from serving.engine.paged_cache import BatchMetadata, PagedKVCache


class TokenEmbedding(nn.Embedding):
    """The token embedding [V, E]: an `nn.Embedding` whose weight may instead be GGUF blocks (`GGUFWeight`),
    looked up row by row without decoding the rest. ids [...] int64 -> [..., E] in the weight's dtype."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__(num_embeddings, embedding_dim)
        self.weight.requires_grad_(False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        return weight.embedding(token_ids) if isinstance(weight, GGUFWeight) else super().forward(token_ids)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension; `offset=1` gives Gemma's (1 + weight) scaling."""

    def __init__(self, size: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size) if not offset else torch.zeros(size), requires_grad=False)
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch("rms_norm", x, self.weight, self.eps, offset=self.offset)


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads, RoPE, optional q/k/v biases, q/k norms and sliding window.

    Args:
        cfg: model hyperparameters.
        layer: index of this layer (selects the KV-cache slot and sliding/global kind).
        qk_norm_offset: None for no q/k norm (Llama); 1.0 for Gemma 3's (1 + w) RMSNorm per head.
    """

    def __init__(self, cfg: ModelConfig, layer: int, qk_norm_offset: float | None = None):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size, cfg.hidden_size), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(cfg.hidden_size, self.q_size), requires_grad=False)
        # Qwen2: q/k/v biases, fused like the weights: [q_size + 2 * kv_size].
        self.qkv_bias = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size), requires_grad=False) if cfg.qkv_bias else None
        self.q_norm = self.k_norm = None
        if qk_norm_offset is not None:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, qk_norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, qk_norm_offset)
        self.scale = cfg.attention_scale
        self.sliding_window = cfg.sliding_window if cfg.is_sliding(layer) else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: BatchMetadata, cache: PagedKVCache) -> torch.Tensor:
        """x: [N, E] hidden states of the batch's new tokens. Returns [N, E]."""
        num_tokens = x.shape[0]
        qkv = dispatch("linear", x, self.qkv_proj, self.qkv_bias)
        cos, sin = rope
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:  # q and k are adjacent in qkv: rotate them in one call
            qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
            qk = dispatch("rotary", qk, cos, sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        else:
            q, k, _ = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
            q = self.q_norm(q.reshape(num_tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.reshape(num_tokens, self.num_kv_heads, self.head_dim))
            q, k = dispatch("rotary", q, cos, sin), dispatch("rotary", k, cos, sin)
        # Every new token's K/V is written before any is read, so a sequence that shares a block
        # another sequence fills in this same step reads it complete.
        # A sliding-window layer with its own pool (only where the cache has one) uses that pool's slots
        # and block tables, whose released entries lie outside every query's window.
        sliding = cache.is_sliding(self.layer)
        cache.write(self.layer, batch.sliding_slot_mapping if sliding else batch.slot_mapping, k, v)
        out = dispatch(
            "paged_attention", q, cache.keys[self.layer], cache.values[self.layer],
            batch.sliding_block_tables if sliding else batch.block_tables,
            batch.seq_lens, batch.query_lens, scale=self.scale, sliding_window=self.sliding_window,
        )
        return dispatch("linear", out.reshape(num_tokens, self.q_size), self.o_proj)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with the gate and up projections fused into one [2F, E] matrix."""

    def __init__(self, cfg: ModelConfig, activation: str):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(2 * cfg.intermediate_size, cfg.hidden_size), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(cfg.hidden_size, cfg.intermediate_size), requires_grad=False)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch("gated_mlp", x, self.gate_up_proj, self.down_proj, self.activation)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, scaling: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [N, D] for absolute `positions` [N], positions divided by a linear `scaling`."""
    if scaling != 1.0:
        positions = positions / scaling
    return dispatch("rotary_cos_sin", positions, head_dim, theta, dtype)
