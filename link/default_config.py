"""The embedded default's models and policies (`link serve` without a config), as link.yaml text.

`link.config.embedded_default` parses it and adds `link/auto` when its trained router file is present.
"""

# The embedded default: three local chat models (each model name is also a fixed policy of itself), the
# Mixture-of-Agents `link/moa` over them and, when its trained file is present, the router `link/auto`.
# Prices are nominal (USD per million tokens, input = output): local compute is not free, and the router's
# cost penalty and budgets need a price to trade against; they grow with the parameter count (135M, 0.5B,
# 1.5B). gemma-3-270m (a base model) stays in the engine's registry for a link.yaml to serve.
# Resident weights in float32 (bfloat16 halves them), loaded on first use: smollm2 0.5 GB, Qwen 0.5B 2.5 GB,
# Qwen 1.5B 7.1 GB. A Qwen KV cache of 512 MiB holds 21,845 (0.5B) or 9,362 (1.5B) float32 tokens, so an
# 8,000-token prompt fits either; `/v1/models` of the engine reports the cap as `max_model_len`.
DEFAULT_CONFIG_YAML = """
models:
  - name: smollm2-135m-instruct
    kind: local
    local: smollm2-135m-instruct
    context_length: 8192
    first_token_timeout_s: 120
    input_cost_per_million: 0.02
    output_cost_per_million: 0.02
  - name: qwen2.5-coder-0.5b-instruct
    kind: local
    local: qwen2.5-coder-0.5b-instruct
    context_length: 32768
    first_token_timeout_s: 300
    input_cost_per_million: 0.08
    output_cost_per_million: 0.08
    engine: {kv_cache_mb: 512}
  - name: qwen2.5-coder-1.5b-instruct
    kind: local
    local: qwen2.5-coder-1.5b-instruct
    context_length: 32768
    first_token_timeout_s: 300
    input_cost_per_million: 0.24
    output_cost_per_million: 0.24
    engine: {kv_cache_mb: 512}
policies:
  - name: link/moa
    type: moa
    models: [smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct]
    options: {aggregator: qwen2.5-coder-0.5b-instruct, layers: 1, deadline_s: 120, proposer_max_tokens: 512}
"""
