"""`EngineConfig`: the settings of one `LLMEngine`, and how its KV budget splits into block pools.

    config = EngineConfig(max_num_seqs=8, speculative=SpeculativeConfig())
    num_blocks, num_sliding_blocks = pool_sizes(loaded, config)
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.engine.paged_cache import PagedKVCache
from serving.engine.sliding_block_manager import max_batch_blocks, plan_pool_sizes
from serving.model_loader import LoadedModel
from serving.spec_decode.config import SpeculativeConfig


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        block_size: tokens per KV block.
        kv_cache_bytes: memory for the KV cache; sets the number of blocks unless `num_blocks` is given.
        num_blocks: explicit KV block count of the global pool (overrides `kv_cache_bytes`).
        max_num_seqs, max_num_batched_tokens: see `SchedulerConfig`.
        enable_prefix_caching: reuse KV blocks across requests sharing a prefix (off on a model whose
            sliding-window layers have their own pool, see below).
        sliding_window_pool: give sliding-window layers (Gemma 3) their own KV pool that keeps only the
            blocks the window needs; `kv_cache_bytes` is split by `plan_pool_sizes`. False keeps one
            pool for all layers, with prefix caching. No effect on models without such layers.
        num_sliding_blocks: explicit sliding-pool block count (default: `plan_pool_sizes`, or with an
            explicit `num_blocks` the smaller of it and `max_batch_blocks`).
        tuned_kernels: at start, install the winners `link compile tune` stored for this model, device
            and library versions ($LINK_HOME/compile/winners.sqlite, `kernels.tuner.install_stored`);
            nothing happens when the file does not exist. Also stages the CPU's default kernels for the buckets no
            winner covers (`kernels.cpu_defaults`, when our C++ kernel is already built here).
        auto_tune: with `tuned_kernels`, the servers (`link engine serve`, the gateway's local engines) tune the
            shapes their traffic records while the engine is idle and install the winners between steps
            (`serving.tuning.auto_kernels`); the offline `LLMEngine` ignores it.
        speculative: speculative decoding (`serving.spec_decode`); None (the default) decodes one token
            per step.
        sample_timeout_s: seconds one sequence may take to choose one token (guided decoding's walk of the
            vocabulary, logits processing); a request over it is stopped with `SamplingTimeoutError` so that
            no request holds a step (`serving.engine.sample_budget`). SmolLM2's whole 49k-token vocabulary walks in
            about 0.3 s on a busy 2-core CPU; Gemma 3's is 5 times larger.
        stall_timeout_s: seconds without a finished step, while requests wait, after which
            `serving.engine.async_engine.AsyncLLMEngine` calls its loop stalled and /health answers 503.
    Raises:
        ValueError: a timeout that is not positive.
    """

    block_size: int = 16
    kv_cache_bytes: int = 256 * 2**20
    num_blocks: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    sliding_window_pool: bool = True
    num_sliding_blocks: int | None = None
    tuned_kernels: bool = True
    auto_tune: bool = True
    speculative: SpeculativeConfig | None = None
    sample_timeout_s: float = 5.0
    stall_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not (self.sample_timeout_s > 0 and self.stall_timeout_s > 0):
            raise ValueError(f"sample_timeout_s and stall_timeout_s must be > 0, got {self.sample_timeout_s} and "
                             f"{self.stall_timeout_s}")


def pool_sizes(loaded: LoadedModel, config: EngineConfig) -> tuple[int, int]:
    """(global blocks, sliding-window blocks; 0 = no sliding pool) for `config`'s KV budget or explicit counts."""
    cfg = loaded.config
    num_sliding_layers = sum(cfg.is_sliding(i) for i in range(cfg.num_layers))
    per_layer_block = PagedKVCache.bytes_per_block(1, config.block_size, cfg.num_kv_heads, cfg.head_dim, loaded.dtype)
    if not (config.sliding_window_pool and num_sliding_layers):
        return config.num_blocks or max(1, config.kv_cache_bytes // (cfg.num_layers * per_layer_block)), 0
    num_global, num_sliding = plan_pool_sizes(
        config.kv_cache_bytes // per_layer_block, cfg.num_layers - num_sliding_layers, num_sliding_layers,
        cfg.sliding_window, config.block_size, config.max_num_seqs, config.max_num_batched_tokens,
    )
    if config.num_blocks:  # a sequence never holds more sliding blocks than global ones
        num_global = config.num_blocks
        num_sliding = min(num_global, max_batch_blocks(cfg.sliding_window, config.block_size, config.max_num_seqs,
                                                       config.max_num_batched_tokens))
    if config.num_sliding_blocks:
        num_sliding = config.num_sliding_blocks
    return num_global, num_sliding
