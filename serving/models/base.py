"""`CausalLM`: what every architecture provides to the engine, and weight loading by HF names."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from kernels import dispatch
from kernels.gguf_weight import GGUFWeight, cat_weights
from serving.config import ModelConfig
from serving.engine.paged_cache import BatchMetadata, PagedKVCache
from serving.errors import ModelFileError
from serving.models.layers import TokenEmbedding

# Hugging Face projections that we store fused: target parameter suffix -> ordered source suffixes.
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attn.qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
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
        self.embed_tokens = TokenEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)

    def allocate_cache(self, num_blocks: int, block_size: int, num_sliding_blocks: int = 0) -> PagedKVCache:
        """A zeroed paged KV cache of `num_blocks` blocks of `block_size` tokens, in the model dtype.

        With `num_sliding_blocks` > 0 the sliding-window layers get their own pool of that many blocks
        (`serving.engine.sliding_block_manager`); with 0 every layer uses the one pool.
        """
        cfg = self.config
        sliding = frozenset(i for i in range(cfg.num_layers) if cfg.is_sliding(i)) if num_sliding_blocks else frozenset()
        return PagedKVCache.allocate(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                                     self.embed_tokens.weight.dtype, sliding, num_sliding_blocks)

    def forward(self, token_ids: torch.Tensor, batch: BatchMetadata, cache: PagedKVCache) -> torch.Tensor:
        """Run the batch's new tokens. token_ids: [N] int64. Returns final hidden states [N, E]."""
        raise NotImplementedError

    @torch.inference_mode()
    def prefill_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [T, V] at every position of one sequence, with a throwaway cache (tests, scoring)."""
        block_size = 16
        num_blocks = -(-len(token_ids) // block_size)
        cache = self.allocate_cache(num_blocks, block_size)
        batch = BatchMetadata(
            positions=torch.arange(len(token_ids)), slot_mapping=torch.arange(len(token_ids)),
            block_tables=torch.arange(num_blocks)[None, :], seq_lens=[len(token_ids)], query_lens=[len(token_ids)],
        )
        return self.compute_logits(self(torch.tensor(token_ids), batch, cache))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, E] -> logits [T, V] in float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head
        return dispatch("linear", hidden, weight).float()

    def packed_weights(self) -> list[GGUFWeight]:
        """The weights held as GGUF blocks (`load_weights` of `GGUFWeight`s), each once (a tied head is the embedding)."""
        found = {id(w): w for m in self.modules() for w in vars(m).values() if isinstance(w, GGUFWeight)}
        return list(found.values())

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor | GGUFWeight]]) -> None:
        """Load Hugging Face-named tensors, fusing q/k/v (weights and biases) and gate/up, casting to the model dtype.

        A `GGUFWeight` (from `GGUFCheckpoint.tensors(packed=True)`) takes its parameter's place as it is, so the
        model then computes on the blocks in float32 (build such a model in float32); fused parts that mix
        blocks and float tensors are fused into one `GGUFWeight` (`kernels.gguf_weight.cat_weights`).

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
            if isinstance(tensor, GGUFWeight):
                self._put_packed(name, tensor)
            else:
                param.data.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ModelFileError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")

    def _put_packed(self, name: str, weight: GGUFWeight) -> None:
        # nn.Module refuses a non-Parameter in a registered parameter's slot: unregister it, then set a plain attribute.
        path, _, attr = name.rpartition(".")
        owner = self.get_submodule(path)
        del owner._parameters[attr]
        setattr(owner, attr, weight)

    def _target(self, name: str, pending: dict, tensor: torch.Tensor | GGUFWeight) -> tuple[str, torch.Tensor] | None:
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
                    tensors = [group[p] for p in parts]
                    if any(isinstance(t, GGUFWeight) for t in tensors):
                        return prefix + fused, cat_weights(tensors)
                    return prefix + fused, torch.cat(tensors, dim=0)
        for suffix, target in _RENAMED.items():
            if name.endswith(suffix):
                return name[: -len(suffix)] + target, tensor
        return name, tensor
