"""`ModelConfig`: the architecture hyperparameters of one checkpoint, read from GGUF or config.json."""

from __future__ import annotations

from dataclasses import dataclass

from serving.errors import UnsupportedArchitectureError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters that fix a model's shapes and numerics.

    Attributes:
        architecture: "llama" (Llama, SmolLM2), "qwen2" (Qwen2, Qwen2.5) or "gemma3".
        vocab_size, hidden_size (E), intermediate_size (F), num_layers, num_heads (H),
        num_kv_heads (K), head_dim (D): shapes.
        rms_norm_eps: epsilon of every RMSNorm.
        rope_theta: RoPE base of global-attention layers.
        context_length: the longest sequence (prompt + output) in tokens.
        tie_word_embeddings: the output projection reuses the token embedding.
        rope_scaling_factor: linear RoPE position scaling of global layers (1.0 = none).
        rope_local_theta: RoPE base of sliding-window layers (Gemma 3: 10,000).
        sliding_window: W tokens seen by sliding-window layers, or None.
        sliding_window_pattern: every N-th layer is global, the others slide (Gemma 3: 6).
        query_pre_attn_scalar: attention scale is this ** -0.5 (Gemma 3: 256); None = head_dim.
        qkv_bias: the q/k/v projections add a bias (Qwen2); the output projection never does.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    context_length: int
    tie_word_embeddings: bool = True
    rope_scaling_factor: float = 1.0
    rope_local_theta: float | None = None
    sliding_window: int | None = None
    sliding_window_pattern: int | None = None
    query_pre_attn_scalar: float | None = None
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"architecture {self.architecture!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` uses sliding-window attention (Gemma 3: all but every N-th layer)."""
        if self.sliding_window is None or not self.sliding_window_pattern:
            return False
        return (layer + 1) % self.sliding_window_pattern != 0

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelConfig":
        """Build from a Hugging Face `config.json` dict (LlamaForCausalLM, Qwen2ForCausalLM or Gemma3ForCausalLM)."""
        model_type = cfg.get("model_type", "")
        arch = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3", "gemma3": "gemma3"}.get(model_type)
        if arch is None:
            raise UnsupportedArchitectureError(
                f"config.json model_type {model_type!r} is not supported; supported: llama, qwen2, gemma3_text"
            )
        if "text_config" in cfg:
            cfg = {**cfg, **cfg["text_config"]}
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        global_rope = rope.get("full_attention", rope) if rope else {}
        local_rope = rope.get("sliding_attention", {}) if rope else {}
        rope_theta = global_rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or global_rope
        factor = float(scaling.get("factor", 1.0)) if scaling.get("rope_type", scaling.get("type")) == "linear" else 1.0
        pattern = cfg.get("sliding_window_pattern")
        layer_types = cfg.get("layer_types")
        if arch == "gemma3" and pattern is None:
            pattern = (layer_types.index("full_attention") + 1) if layer_types and "full_attention" in layer_types else 6
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            context_length=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", True),
            rope_scaling_factor=factor,
            rope_local_theta=float(local_rope.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))) if arch == "gemma3" else None,
            sliding_window=cfg.get("sliding_window") if arch == "gemma3" else None,
            sliding_window_pattern=pattern if arch == "gemma3" else None,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar") if arch == "gemma3" else None,
            qkv_bias=arch == "qwen2",
        )
