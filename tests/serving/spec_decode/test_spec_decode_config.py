"""`SpeculativeConfig` validation and how link.yaml's `engine: speculative:` and the CLI build it."""

import pytest

from link.config import EngineOptions
from serving.engine.llm_engine import EngineConfig
from serving.spec_decode import SpeculativeConfig


def test_defaults_are_off_and_valid():
    assert EngineConfig().speculative is None
    cfg = SpeculativeConfig()
    assert (cfg.method, cfg.num_speculative_tokens, cfg.min_speculative_tokens, cfg.disable_by_batch_size) == ("ngram", 5, 1, 4)


@pytest.mark.parametrize("kwargs, field", [
    ({"method": "medusa"}, "method"),
    ({"method": "draft"}, "draft_model"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 2, "min_speculative_tokens": 3}, "min_speculative_tokens"),
    ({"ngram_min": 3, "ngram_max": 2}, "ngram_min"),
    ({"disable_by_batch_size": 0}, "disable_by_batch_size"),
    ({"ema_alpha": 0.0}, "ema_alpha"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig(**kwargs)


def test_engine_options_build_the_speculative_config():
    config = EngineOptions(speculative={"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 2}).engine_config()
    assert config.speculative == SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=2)
    assert EngineOptions().engine_config().speculative is None


def test_engine_options_reject_unknown_speculative_fields():
    with pytest.raises(ValueError, match="methd"):
        EngineOptions(speculative={"methd": "ngram"})


def test_engine_serve_builds_the_speculative_config(monkeypatch):
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import protocol.drain
    import serving.api.server
    import serving.model_loader
    from cli.app import app

    seen = {}

    def fake_app(model, engine_config, loaded):
        seen["config"] = engine_config
        return SimpleNamespace(state=SimpleNamespace(drain=None))

    monkeypatch.setattr(serving.model_loader, "load_model", lambda spec, dtype, weights="auto": "loaded")
    monkeypatch.setattr(serving.api.server, "create_engine_app", fake_app)
    monkeypatch.setattr(protocol.drain, "serve_draining", lambda app, drain, **kwargs: None)
    runner = CliRunner()
    result = runner.invoke(app, ["engine", "serve", "--speculative", "ngram", "--num-speculative-tokens", "3", "--no-speculative-adaptive",
                                 "--speculative-disable-by-batch-size", "6"])
    assert result.exit_code == 0, result.output
    assert seen["config"].speculative == SpeculativeConfig(num_speculative_tokens=3, adaptive=False, disable_by_batch_size=6)
    result = runner.invoke(app, ["engine", "serve", "--speculative", "ngram", "--speculative-disable-by-batch-size", "0"])
    assert result.exit_code == 2 and "disable_by_batch_size" in result.output
    result = runner.invoke(app, ["engine", "serve", "--speculative", "draft"])
    assert result.exit_code == 2 and "draft_model" in result.output
