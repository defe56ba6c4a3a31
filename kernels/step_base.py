"""What the whole-step variants of "decode_step" share: the models they compute and the thread counts tried.

    is_llama_like(model)     # a Llama-family forward both the compiled and the C++ step reproduce
    thread_candidates()      # [1, cores // 2, cores]: one variant per count

The compiled steps (`kernels.compiled`) and the C++ steps (`kernels.native_step`) are siblings: each
imports this module, neither imports the other.
"""

from __future__ import annotations

import os

import torch


def thread_candidates() -> list[int]:
    """Thread counts worth trying here: 1, half the cores, all cores (deduplicated, ascending)."""
    cores = os.cpu_count() or 1
    return sorted({1, max(1, cores // 2), cores})


def is_llama_like(model) -> bool:
    """Whether `model` (a `serving.models` causal LM) is a Llama-family model the whole-step variants compute:
    architecture "llama", no q/k norms, no sliding window, no RoPE scaling, SiLU MLPs, every weight a float tensor
    (a model holding GGUF blocks, `kernels.gguf_weight.GGUFWeight`, runs the eager forward)."""
    cfg = getattr(model, "config", None)
    return (cfg is not None and cfg.architecture == "llama" and cfg.sliding_window is None and cfg.rope_scaling_factor == 1.0
            and isinstance(model.embed_tokens.weight, torch.Tensor)
            and isinstance(getattr(model, "lm_head", None), (torch.Tensor, type(None)))
            and all(layer.self_attn.q_norm is None and layer.mlp.activation == "silu" for layer in model.layers)
            and all(isinstance(w, torch.Tensor) for layer in model.layers
                    for w in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)))
