"""`CausalLM`: what every architecture provides to the engine, and weight loading by HF names."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from kernels import dispatch
from serving.config import ModelConfig
from serving.errors import ModelFileError
from serving.kv_cache import ContiguousKVCache

# Hugging Face projections that we store fused: target parameter suffix -> ordered source suffixes.
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.gate_up_proj": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
_RENAMED = {"self_attn.o_proj.weight": "self_attn.o_proj", "mlp.down_proj.weight": "mlp.down_proj"}


class CausalLM(nn.Module):
    """A decoder-only language model: token ids in, hidden states and logits out.

    Subclasses build `self.layers`, `self.embed_tokens`, `self.norm` and `self.lm_head` and implement
    `embed()` and `forward()`.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)

    def allocate_cache(self, capacity: int) -> ContiguousKVCache:
        cfg = self.config
        return ContiguousKVCache.allocate(cfg.num_layers, capacity, cfg.num_kv_heads, cfg.head_dim, self.embed_tokens.weight.dtype)

    def forward(self, token_ids: torch.Tensor, start: int, cache: ContiguousKVCache) -> torch.Tensor:
        """Run positions [start, start+T). token_ids: [T] int64. Returns final hidden states [T, E]."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, E] -> logits [T, V] in float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head
        return dispatch("linear", hidden, weight).float()

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors, fusing q/k/v and gate/up, casting to the model dtype.

        Raises:
            ModelFileError: a tensor is missing, unexpected, or of the wrong shape.
        """
        params = dict(self.named_parameters())
        pending: dict[str, dict[str, torch.Tensor]] = {}
        loaded: set[str] = set()
        for name, tensor in tensors:
            target = self._target(name, pending, tensor)
            if target is None:
                continue
            name, tensor = target
            if name not in params:
                raise ModelFileError(f"checkpoint tensor {name!r} has no place in the {self.config.architecture} model")
            param = params[name]
            if param.shape != tensor.shape:
                raise ModelFileError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
            param.data.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ModelFileError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")

    def _target(self, name: str, pending: dict, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        if name.endswith("rotary_emb.inv_freq"):
            return None
        name = name.removeprefix("model.")
        if name == "lm_head.weight":
            return None if self.lm_head is None else ("lm_head", tensor)  # tied: the embedding serves
        for fused, parts in _FUSED.items():
            for part in parts:
                if name.endswith(part):
                    prefix = name[: -len(part)]
                    group = pending.setdefault(prefix + fused, {})
                    group[part] = tensor
                    if len(group) < len(parts):
                        return None
                    del pending[prefix + fused]
                    return prefix + fused, torch.cat([group[p] for p in parts], dim=0)
        for suffix, target in _RENAMED.items():
            if name.endswith(suffix):
                return name[: -len(suffix)] + target, tensor
        return name, tensor
