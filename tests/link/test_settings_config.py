"""`link.settings` (LINK_* variables, placeholder master keys) and `link.config` (link.yaml parsing and errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from link.config import ConfigError, LinkConfig, load_config, parse_config
from link.policies.base import policy_entry_problems
from link.settings import Settings, get_settings, is_placeholder_key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("LINK_CONFIG", "LINK_DATABASE_URL", "LINK_REDIS_URL", "LINK_MASTER_KEY", "LINK_ENVIRONMENT", "LINK_PORT",
                 "LINK_HOST", "LINK_REQUEST_LOG", "LINK_BUDGETS", "LINK_DATASETS_DIR", "LINK_MAX_BODY_BYTES",
                 "LINK_MAX_JSON_DEPTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LINK_HOME", str(tmp_path))
    return monkeypatch


def test_settings_defaults_derive_from_home(clean_env, tmp_path):
    s = get_settings()
    assert s.home == tmp_path and s.config is None and s.environment == "development"
    assert s.database_url == f"sqlite:///{tmp_path / 'link.db'}"
    assert s.datasets_dir == tmp_path / "datasets"
    assert (s.host, s.port, s.request_log, s.budgets, s.redis_url, s.master_key) == ("127.0.0.1", 8000, True, True, None, None)


def test_settings_read_link_variables_and_explicit_values_win(clean_env):
    clean_env.setenv("LINK_PORT", "9100")
    clean_env.setenv("LINK_REQUEST_LOG", "false")
    clean_env.setenv("LINK_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/link")
    clean_env.setenv("LINK_CONFIG", "/etc/link.yaml")
    s = get_settings()
    assert s.port == 9100 and s.request_log is False and s.config == Path("/etc/link.yaml")
    assert s.database_url == "postgresql://postgres@127.0.0.1:5432/link"
    assert get_settings(port=9200).port == 9200
    clean_env.setenv("LINK_PORT", "not-a-port")
    with pytest.raises(ValidationError, match="port"):
        get_settings()


def test_body_limits_default_to_16_mib_and_64_levels_and_read_link_variables(clean_env):
    limits = get_settings().body_limits
    assert (limits.max_body_bytes, limits.max_json_depth) == (16 * 2**20, 64)
    clean_env.setenv("LINK_MAX_BODY_BYTES", "65536")
    clean_env.setenv("LINK_MAX_JSON_DEPTH", "128")
    assert (get_settings().body_limits.max_body_bytes, get_settings().body_limits.max_json_depth) == (65536, 128)
    for name, value in (("LINK_MAX_JSON_DEPTH", "129"), ("LINK_MAX_JSON_DEPTH", "7"), ("LINK_MAX_BODY_BYTES", "1023")):
        clean_env.setenv(name, value)
        with pytest.raises(ValidationError, match=name.removeprefix("LINK_").lower()):
            get_settings()
        clean_env.delenv(name)


@pytest.mark.parametrize("key", ["changeme", "sk-1234", "SK-1234", "sk-xxxx", "password", "short-key"])
def test_placeholder_master_keys_are_refused_outside_development(clean_env, key):
    assert is_placeholder_key(key)
    clean_env.setenv("LINK_ENVIRONMENT", "production")
    clean_env.setenv("LINK_MASTER_KEY", key)
    with pytest.raises(ValidationError, match="LINK_MASTER_KEY looks like a placeholder"):
        get_settings()
    clean_env.setenv("LINK_ENVIRONMENT", "development")
    assert get_settings().master_key.get_secret_value() == key


def test_a_real_master_key_is_accepted_in_production_and_never_printed(clean_env):
    key = "sk-3b9f1c0e7d2a4c58a1e6f0b2c9d7e4a1"
    s = Settings(environment="production", master_key=key)
    assert s.is_production and s.master_key.get_secret_value() == key
    assert key not in repr(s) and key not in str(s.model_dump())


def test_embedded_default_serves_the_three_local_chat_models():
    config = load_config(None)
    assert config.model_names == ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
    smol = config.deployments("smollm2-135m-instruct")
    assert len(smol) == 1 and smol[0].kind == "local" and smol[0].local == "smollm2-135m-instruct"
    assert smol[0].deployment_id == "smollm2-135m-instruct#0" and smol[0].provider_model == "smollm2-135m-instruct"
    assert config.deployments("qwen2.5-coder-1.5b-instruct")[0].context_length == 32768
    assert config.deployments("gemma-3-270m") == [] and config.deployments("nope") == []
    # Nominal prices (USD per million tokens, input = output): local compute is not free, and routing trades
    # quality against cost; they grow with the parameter count.
    prices = {m.name: (m.input_cost_per_million, m.output_cost_per_million) for m in config.models}
    assert prices == {"smollm2-135m-instruct": (0.02, 0.02), "qwen2.5-coder-0.5b-instruct": (0.08, 0.08),
                      "qwen2.5-coder-1.5b-instruct": (0.24, 0.24)}
    # A KV cache that holds an 8,000-token prompt for either Qwen model in float32 (57,344 B a token for the 1.5B).
    assert all(m.engine.kv_cache_mb * 2**20 // (28 * 2 * 2 * 128 * 4) >= 8192 for m in config.models[1:])
    moa = config.policy("link/moa")
    assert moa.type == "moa" and moa.models == config.model_names
    assert moa.options["aggregator"] == "qwen2.5-coder-0.5b-instruct"


def test_embedded_default_serves_link_auto_only_with_its_router_file(monkeypatch, tmp_path, caplog):
    import link.config

    monkeypatch.setattr(link.config, "default_router_path", lambda: tmp_path / "link-auto.safetensors")
    with caplog.at_level("INFO", logger="link.config"):
        config = load_config(None)
    assert config.policy("link/auto") is None and [p.name for p in config.policies] == ["link/moa"]
    (line,) = [r.getMessage() for r in caplog.records if "link/auto" in r.getMessage()]
    assert str(tmp_path / "link-auto.safetensors") in line and "link router train" in line
    header = {"models": ["smollm2-135m-instruct", "gemma-3-270m"]}  # a router trained on the earlier pool
    monkeypatch.setattr("routers.base.read_header", lambda path: header)
    (tmp_path / "link-auto.safetensors").write_bytes(b"")
    auto = load_config(None).policy("link/auto")
    assert auto.type == "router" and auto.options == {"path": str(tmp_path / "link-auto.safetensors")}
    assert auto.models == ["smollm2-135m-instruct"]  # its models that the default serves
    header["models"] = ["gemma-3-270m"]  # none served: link/auto is left out, with a line saying why
    caplog.clear()
    with caplog.at_level("INFO", logger="link.config"):
        assert load_config(None).policy("link/auto") is None
    assert any("knows none of the default models" in r.getMessage() for r in caplog.records)


def test_example_config_parses_and_equals_the_default_models():
    example = load_config(ROOT / "link.example.yaml")
    assert example.model_names == load_config(None).model_names
    assert example.policy("link/moa") == load_config(None).policy("link/moa")


def test_replicas_prices_timeouts_and_policies(tmp_path, monkeypatch):
    path = tmp_path / "link.yaml"
    path.write_text("""
models:
  - {name: smol, kind: openai, model: smollm2-135m-instruct, api_base: "http://127.0.0.1:8001/v1"}
  - {name: smol, kind: openai, model: smollm2-135m-instruct, api_base: "http://127.0.0.1:8002/v1", max_connections: 8}
  - name: gpt-4o-mini
    kind: litellm
    model: openai/gpt-4o-mini
    api_key_env: OPENAI_API_KEY
    input_cost_per_million: 0.15
    output_cost_per_million: 0.6
    timeout_s: 30
    first_token_timeout_s: 5
policies:
  - {name: cheap-first, type: fallback, models: [gpt-4o-mini, smol]}
  - {name: just-smol, type: fixed, models: [smol]}
""")
    config = load_config(path)
    assert [d.deployment_id for d in config.deployments("smol")] == ["smol#0", "smol#1"]
    gpt = config.deployments("gpt-4o-mini")[0]
    assert (gpt.timeout_s, gpt.first_token_timeout_s, gpt.api_key_env) == (30, 5, "OPENAI_API_KEY")
    assert gpt.cost_usd(1_000_000, 500_000) == pytest.approx(0.15 + 0.3)
    assert config.policy("cheap-first").models == ["gpt-4o-mini", "smol"] and config.policy("nope") is None
    monkeypatch.setenv("LINK_CONFIG", str(path))
    assert get_settings().config == path


def test_engine_options_set_only_the_fields_given():
    from serving.engine.llm_engine import EngineConfig

    config = parse_config({"models": [{"name": "g", "kind": "local", "local": "gemma-3-270m",
                                       "engine": {"kv_cache_mb": 1024, "sliding_window_pool": False}}]})
    engine = config.deployments("g")[0].engine.engine_config()
    defaults = EngineConfig()
    assert (engine.kv_cache_bytes, engine.sliding_window_pool) == (1024 * 2**20, False)
    assert (engine.max_num_seqs, engine.block_size, engine.enable_prefix_caching) == (
        defaults.max_num_seqs, defaults.block_size, defaults.enable_prefix_caching)


def test_local_weights_come_from_the_deployment_or_link_local_weights(clean_env):
    config = parse_config({"models": [{"name": "q", "kind": "local", "local": "qwen2.5-coder-0.5b-instruct",
                                       "engine": {"weights": "float", "kv_cache_mb": 32}}]})
    options = config.deployments("q")[0].engine
    assert options.weights == "float" and options.engine_config().kv_cache_bytes == 32 * 2**20  # no EngineConfig field
    assert get_settings().local_weights == "auto"
    clean_env.setenv("LINK_LOCAL_WEIGHTS", "float")
    assert get_settings().local_weights == "float"


@pytest.mark.parametrize("entry, expected", [
    ({"name": "a", "kind": "local"}, "models[0] (name 'a'): kind 'local' needs `local`"),
    ({"name": "a", "kind": "litellm"}, "models[0] (name 'a'): kind 'litellm' needs `model`"),
    ({"name": "a", "kind": "openai", "model": "m"}, "models[0] (name 'a'): kind 'openai' needs `api_base`"),
    ({"name": "a", "kind": "vllm"}, "models[0].kind (name 'a'): Input should be 'local', 'litellm' or 'openai'"),
    ({"name": "a", "kind": "openai", "api_base": "127.0.0.1:8001"}, "must start with http:// or https://"),
    ({"name": "a", "kind": "litellm", "model": "openai/x", "api_key_env": "sk-live-123"}, "NAME of an environment variable"),
    ({"name": "a", "kind": "litellm", "model": "openai/x", "api_bse": "http://x"}, "models[0].api_bse (name 'a'): unknown field"),
    ({"name": "a", "kind": "litellm", "model": "openai/x", "input_cost_per_million": -1},
     "models[0].input_cost_per_million (name 'a'): Input should be greater than or equal to 0"),
    ({"name": "a", "kind": "litellm", "model": "openai/x", "timeout_s": 5, "first_token_timeout_s": 10},
     "first_token_timeout_s (10.0) exceeds timeout_s (5.0)"),
    ({"name": "a", "kind": "local", "local": "/models/x.gguf"}, "needs `architecture`"),
    ({"name": "a", "kind": "local", "local": "smol", "api_base": "http://x"}, "`api_base` does not apply to kind 'local'"),
    ({"name": "my model", "kind": "local", "local": "smol"}, "no spaces"),
    ({"kind": "local", "local": "smol"}, "models[0].name: required field is missing"),
    ({"name": "a", "kind": "litellm", "model": "openai/x", "engine": {"max_num_seqs": 4}}, "`engine` applies only to kind 'local'"),
    ({"name": "a", "kind": "local", "local": "smol", "engine": {"dtype": "fp8"}}, "models[0].engine.dtype (name 'a'): Input should be 'auto', 'float32' or 'bfloat16'"),
    ({"name": "a", "kind": "local", "local": "smol", "engine": {"weights": "int4"}},
     "models[0].engine.weights (name 'a'): Input should be 'auto', 'packed' or 'float'"),
    ({"name": "a", "kind": "local", "local": "smol", "engine": {"kv_cache_mb": 8}},
     "models[0].engine.kv_cache_mb (name 'a'): Input should be greater than or equal to 16"),
    ({"name": "a", "kind": "local", "local": "smol", "engine": {"block_sise": 8}}, "models[0].engine.block_sise (name 'a'): unknown field"),
])
def test_model_errors_name_the_entry_the_field_and_the_fix(entry, expected):
    with pytest.raises(ConfigError) as info:
        parse_config({"models": [entry]}, "link.yaml")
    assert expected in str(info.value) and "link.yaml: " in str(info.value)


@pytest.mark.parametrize("policy, expected", [
    ({"name": "p", "type": "fixed", "models": ["a", "b"]}, "a 'fixed' policy names exactly one model"),
    ({"name": "p", "type": "fallback", "models": ["a"]}, "a 'fallback' policy needs at least two models"),
    ({"name": "p", "type": "fallback", "models": ["a", "zzz"]}, "policies[0].models (name 'p'): unknown model(s) ['zzz']"),
    ({"name": "a", "type": "fixed", "models": ["a"]}, "policies[0].name: 'a' is also a model name"),
    ({"name": "p", "type": "magic", "models": ["a"]}, "policies[0].type (name 'p'): unknown policy type 'magic'; available: cascade, fallback"),
])
def test_policy_errors(policy, expected):
    models = [{"name": "a", "kind": "local", "local": "smollm2-135m-instruct"},
              {"name": "b", "kind": "local", "local": "gemma-3-270m"}]
    with pytest.raises(ConfigError) as info:
        parse_config({"models": models, "policies": [policy]})
    assert expected in str(info.value)


def test_file_errors_are_config_errors_with_a_location(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: a\n    kind: [local\n")
    with pytest.raises(ConfigError, match=r"YAML syntax error at line \d+"):
        load_config(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(top)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == LinkConfig()


def test_every_mistake_of_a_file_is_reported_at_once(tmp_path):
    # five independent mistakes: a field, two checks between fields, a policy over a misspelt model (a check
    # between entries), a policy option and a policy name used twice
    path = tmp_path / "link.yaml"
    path.write_text("""
models:
  - {name: smol, kind: local, local: smollm2-135m-instruct}
  - {name: gpt, kind: litellm, model: openai/gpt-4o-mini, api_key_env: sk-live-123}
  - {name: remote, kind: openai, model: m, timeout_s: 5, first_token_timeout_s: 10}
policies:
  - {name: cheap-first, type: fallback, models: [smol, gtp]}
  - {name: safe, type: fallback, models: [smol, remote], options: {colour: red}}
  - {name: safe, type: fixed, models: [smol]}
""")
    with pytest.raises(ConfigError) as info:
        load_config(path, check_policy=policy_entry_problems)
    assert str(info.value).splitlines() == [
        "invalid config (5 problems):",
        f"  {path}: models[1].api_key_env (name 'gpt'): must be the NAME of an environment variable "
        "(e.g. OPENAI_API_KEY), never the key itself",
        f"  {path}: models[2] (name 'remote'): first_token_timeout_s (10.0) exceeds timeout_s (5.0); lower it or "
        "raise timeout_s; kind 'openai' needs `api_base`, e.g. 'http://127.0.0.1:8001/v1'",
        f"  {path}: policies[0].models (name 'cheap-first'): unknown model(s) ['gtp']; known: ['gpt', 'remote', 'smol']",
        f"  {path}: policies[1].options.colour (name 'safe'): unknown option 'colour' of a 'fallback' policy; "
        "its options: capture_traces, continue_on_failure, cache",
        f"  {path}: policies[2].name: 'safe' is already the name of policies[1]; keep one",
    ]


def test_every_option_mistake_of_one_policy_is_reported_at_once(tmp_path):
    # Policy.check stops at its first problem; a start used to show one option mistake of an entry per try
    path = tmp_path / "link.yaml"
    path.write_text("""
models:
  - {name: smol, kind: local, local: smollm2-135m-instruct}
  - {name: remote, kind: openai, api_base: "http://127.0.0.1:8001/v1"}
policies:
  - {name: my-moa, type: moa, models: [smol, remote], options: {aggregatr: smol, layers: 9, deadline_s: -5}}
""")
    with pytest.raises(ConfigError) as info:
        load_config(path, check_policy=policy_entry_problems)
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid config (3 problems):", lines
    assert [line.split(": ", 1)[1].split(" (name")[0] for line in lines[1:]] == [
        "policies[0].options.aggregatr", "policies[0].options.layers", "policies[0].options.deadline_s"]
    assert "must be a whole number in [1, 4], got 9" in lines[2] and "got -5" in lines[3]


def test_a_valid_file_with_policies_loads(tmp_path):
    path = tmp_path / "link.yaml"
    path.write_text("""
models:
  - {name: smol, kind: local, local: smollm2-135m-instruct}
  - {name: remote, kind: openai, api_base: "http://127.0.0.1:8001/v1"}
policies:
  - {name: safe, type: fallback, models: [remote, smol], options: {capture_traces: true}}
""")
    config = load_config(path, check_policy=policy_entry_problems)
    assert config.policy("safe").models == ["remote", "smol"] and config.model_names == ["smol", "remote"]
