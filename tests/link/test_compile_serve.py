"""`link serve`'s background kernel tuning (link.yaml `engine: {compile_tune: true}`): off by default;
on, the engine pool attaches a shape recorder and starts one `BackgroundTuner` with the configured budget,
stopped when the pool closes."""

from __future__ import annotations

import asyncio

import pytest

import kernels
from kernels.tuner import BackgroundTuner
from link.backends.local import EnginePool
from link.config import EngineOptions, ModelDeployment


def test_compile_options_are_off_by_default_and_not_engine_config_fields():
    options = EngineOptions(kv_cache_mb=64)
    assert options.compile_tune is False and options.compile_budget_s == 60.0
    assert options.engine_config().kv_cache_bytes == 64 * 2**20
    with pytest.raises(ValueError):
        EngineOptions(compile_budget_s=0)


@pytest.mark.slow
def test_compile_tune_starts_a_background_tuner(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_COMPILE_DB", str(tmp_path / "winners.sqlite"))
    previous = kernels.attach_recorder(None)
    pool = EnginePool()
    deployment = ModelDeployment(name="smol", kind="local", local="smollm2-135m-instruct",
                                 engine=EngineOptions(kv_cache_mb=16, compile_tune=True, compile_budget_s=5, compile_interval_s=3600))
    try:
        pool._make_state("smollm2-135m-instruct", smollm2.loaded, deployment)
        assert kernels.recorder() is not None
        (background,) = pool._tuners
        assert isinstance(background, BackgroundTuner)
        assert (background.budget_s, background.interval_s, background.tuner.env.model) == (5, 3600, "smollm2-135m-instruct")
        asyncio.run(pool.aclose())
        assert background._stop.is_set()
    finally:
        kernels.attach_recorder(previous)
        kernels.reset()
