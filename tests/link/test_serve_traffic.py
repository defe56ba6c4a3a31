"""`link serve` records each local model's traffic: the engine pool gives every engine a
`TrafficRecorder` and writes its mix to $LINK_HOME/compile/traffic/<model>.jsonl when it closes."""

from __future__ import annotations

import asyncio

import pytest

from link.backends.local import EnginePool
from serving.sampling.params import SamplingParams
from serving.tuning.traffic import RequestShape, load_mix, traffic_path

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)


def test_the_pool_saves_the_recorded_mix_on_close(smollm2_fp32, tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_HOME", str(tmp_path))

    async def go():
        pool = EnginePool()
        pool.add_loaded("smollm2-135m-instruct", smollm2_fp32)
        state = await pool.get(type("Dep", (), {"local": "smollm2-135m-instruct"})())
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        async for _ in state.engine.generate("a", [1, 2, 3, 4, 5], params):
            pass
        await pool.aclose()

    asyncio.run(go())
    path = traffic_path("smollm2-135m-instruct")
    assert path == tmp_path / "compile" / "traffic" / "smollm2-135m-instruct.jsonl"
    assert load_mix(path) == [RequestShape(5, 3, 0.0, "greedy")]
