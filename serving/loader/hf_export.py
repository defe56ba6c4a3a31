"""Write a GGUF model as a Hugging Face checkpoint folder (config.json, model.safetensors, tokenizer).

Used to fine-tune GGUF models with Hugging Face tooling (peft) and to test the safetensors loader.
The weights are the dequantized GGUF tensors in the Hugging Face layout, so loading the folder with
`open_safetensors` (or `transformers`) gives the same model as loading the GGUF file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from serving.config import ModelConfig
from serving.loader.gguf_loader import open_gguf
from serving.text.tokenizer import Tokenizer


def hf_config(cfg: ModelConfig, bos_token_id: int | None, eos_token_id: int | None) -> dict:
    """The Hugging Face config.json dict for `cfg` (LlamaForCausalLM, Qwen2ForCausalLM or Gemma3ForCausalLM)."""
    common = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.context_length, "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "torch_dtype": "float32",
    }
    if cfg.architecture == "llama":
        return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                "rope_theta": cfg.rope_theta, "attention_bias": False, "mlp_bias": False}
    if cfg.architecture == "qwen2":  # q/k/v biases are implied by the model type
        return {**common, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
                "rope_theta": cfg.rope_theta, "use_sliding_window": False}
    pattern = cfg.sliding_window_pattern or 6
    return {
        **common, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh", "rope_theta": cfg.rope_theta,
        "rope_local_base_freq": cfg.rope_local_theta, "sliding_window": cfg.sliding_window,
        "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(cfg.num_layers)],
        "rope_scaling": {"rope_type": "linear", "factor": cfg.rope_scaling_factor} if cfg.rope_scaling_factor != 1.0 else None,
    }


def export_hf_checkpoint(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Convert a GGUF file into a Hugging Face checkpoint folder.

    Args:
        gguf_path: the .gguf file.
        out_dir: created if needed; receives config.json, model.safetensors, tokenizer.json,
            tokenizer_config.json (with the chat template) and generation_config.json.
        dtype: dtype of the stored weights.
    Returns:
        out_dir as a Path.
    Raises:
        ModelFileError, UnsupportedTensorTypeError: see `open_gguf`.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = open_gguf(gguf_path)
    tokenizer = Tokenizer.from_gguf(gguf_path, ckpt.metadata)
    tensors = {name: t.to(dtype).contiguous() for name, t in ckpt.tensors() if name != "lm_head.weight" or not ckpt.config.tie_word_embeddings}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    bos, eos = ckpt.metadata.get("tokenizer.ggml.bos_token_id"), ckpt.metadata.get("tokenizer.ggml.eos_token_id")
    (out / "config.json").write_text(json.dumps(hf_config(ckpt.config, bos, eos), indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": list(tokenizer.eos_token_ids)}, indent=2))
    shutil.copyfile(tokenizer.source_dir / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((tokenizer.source_dir / "tokenizer_config.json").read_text())
    if tokenizer.chat_template:
        tok_config["chat_template"] = tokenizer.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return out
