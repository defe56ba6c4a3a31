"""`link serve`'s background kernel tuning: the idle-gap `AutoTuner` on by default (off with `--no-auto-tune`,
`LINK_LOCAL_AUTO_TUNE=false` or `engine: {auto_tune: false}`); link.yaml `engine: {compile_tune: true}` replaces it
with one `BackgroundTuner` of the configured budget. Either is stopped when the pool closes."""

from __future__ import annotations

import asyncio

import pytest

import kernels
from kernels.background import AutoTuner, BackgroundTuner, running
from link.backends.local import EnginePool
from link.config import EngineOptions, ModelDeployment
from link.settings import get_settings


def test_compile_options_are_off_by_default_and_not_engine_config_fields():
    options = EngineOptions(kv_cache_mb=64)
    assert options.compile_tune is False and options.compile_budget_s == 60.0
    assert options.engine_config().kv_cache_bytes == 64 * 2**20
    with pytest.raises(ValueError):
        EngineOptions(compile_budget_s=0)


def test_auto_tune_is_on_unless_a_flag_or_the_fixed_rounds_turn_it_off(monkeypatch):
    assert EngineOptions().engine_config().auto_tune is True
    assert EngineOptions(auto_tune=False).engine_config().auto_tune is False
    assert EngineOptions(compile_tune=True).engine_config().auto_tune is False  # the rounds replace it
    assert get_settings().local_auto_tune is True
    monkeypatch.setenv("LINK_LOCAL_AUTO_TUNE", "false")
    assert get_settings().local_auto_tune is False


@pytest.mark.slow
def test_the_pool_starts_one_auto_tuner_per_engine_unless_turned_off(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_COMPILE_DB", str(tmp_path / "winners.sqlite"))
    previous = kernels.attach_recorder(None)
    key = "smollm2-135m-instruct"
    try:
        pool = EnginePool()
        state = pool._make_state(key, smollm2.loaded, ModelDeployment(name="smol", kind="local", local=key,
                                                                      engine=EngineOptions(kv_cache_mb=16)))
        assert isinstance(state.auto_tuner, AutoTuner) and state.auto_tuner in running()
        assert pool._tuners == [state.auto_tuner] and not pool.has_work()
        asyncio.run(pool.aclose())
        assert state.auto_tuner.status.state == "stopped" and state.auto_tuner not in running()
        off = EnginePool(auto_tune=False)  # `link serve --no-auto-tune`
        assert off._make_state(key, smollm2.loaded, ModelDeployment(name="smol", kind="local", local=key)).auto_tuner is None
        entry = ModelDeployment(name="smol", kind="local", local=key, engine=EngineOptions(kv_cache_mb=16, auto_tune=False))
        assert EnginePool()._make_state(key, smollm2.loaded, entry).auto_tuner is None
    finally:
        kernels.attach_recorder(previous)
        kernels.reset()


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
