"""`run_eval(signals=...)`: logprobs asked for, extra seeded samples graded, the signals column written and read
back, `link eval export` without texts; and token log-probabilities read from the real engine through the gateway.

    .venv/bin/python -m pytest -q tests/evals/test_runner_signals.py
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from typer.testing import CliRunner

from evals.cli import eval_app
from evals.outcomes import OutcomeTable
from evals.runner import SignalOptions, run_eval
from evals.targets import Completion
from tests.evals.fakes import FakeSuite


class SeededTarget:
    """Greedy: "answer-i" with logprobs [-0.5, -1.5]; sampled (temperature > 0): "answer-i" for an odd seed,
    "wrong" for an even one; every call's params are kept."""

    def __init__(self, name="m", cost_usd=0.001):
        self.name, self.cost_usd, self.params = name, cost_usd, []

    async def chat(self, messages, **params):
        self.params.append(params)
        i = messages[-1]["content"].split()[-1]
        sampled = params.get("temperature", 0) > 0
        text = "wrong" if sampled and params["seed"] % 2 == 0 else f"answer-{i}"
        logprobs = [-0.5, -1.5] if params.get("logprobs") else None
        top = [{"a": -0.5}, {"b": -1.5}] if params.get("top_logprobs") else None
        return Completion(text=text, finish_reason="stop", model=self.name, cost_usd=self.cost_usd,
                          token_logprobs=logprobs, top_logprobs=top)

    async def complete(self, prompt, **params):
        raise AssertionError("a chat suite")


def test_signals_and_samples_are_recorded(tmp_path):
    suite, target = FakeSuite(n=2), SeededTarget()
    options = SignalOptions(top_logprobs=3, samples=3, temperature=0.9)
    result = asyncio.run(run_eval(suite, suite.load(), [target], progress=False, out_dir=tmp_path / "run",
                                  signals=options, seed=10))
    greedy = [p for p in target.params if p["temperature"] == 0.0]
    sampled = [p for p in target.params if p["temperature"] > 0]
    assert len(greedy) == 2 and all(p["logprobs"] is True and p["top_logprobs"] == 3 for p in target.params)
    assert len(sampled) == 6 and sorted({p["seed"] for p in sampled}) == [11, 12, 13]    # seed + j + 1
    assert all(p["temperature"] == 0.9 and p["max_tokens"] == 10 for p in sampled)     # the suite's other params kept
    rows = OutcomeTable.read(tmp_path / "run" / "outcomes.jsonl").rows
    assert [r.score for r in rows] == [1.0, 1.0] and [r.cost_usd for r in rows] == [0.001, 0.001]
    signals = rows[0].signals
    assert signals["key"] == "answer-0" and signals["sample_keys"] == ["answer-0", "wrong", "answer-0"]
    assert signals["sample_scores"] == [1.0, 0.0, 1.0] and signals["agreement"] == pytest.approx(2 / 3)
    assert signals["samples_cost_usd"] == pytest.approx(0.003)
    assert signals["logprob_mean"] == -1.0 and signals["logprob_min"] == -1.5 and signals["tokens"] == 2
    assert signals["entropy_mean"] == pytest.approx(sum(-math.exp(v) * v - (1 - math.exp(v)) * math.log(1 - math.exp(v))
                                                        for v in (-0.5, -1.5)) / 2)
    assert result.outcomes.rows[1].signals["key"] == "answer-1"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["totals"]["m"]["cost_usd"] == pytest.approx(0.002)       # the main answers' cost; samples apart

    out = tmp_path / "shipped.jsonl.gz"
    printed = CliRunner().invoke(eval_app, ["export", str(tmp_path / "run" / "outcomes.jsonl"), "--out", str(out)])
    assert printed.exit_code == 0, printed.output
    assert "wrote 2 outcomes (2 prompts; m)" in printed.output
    shipped = OutcomeTable.read(out).rows
    assert [(r.prompt, r.response) for r in shipped] == [("", None), ("", None)]
    assert shipped[0].signals == signals and shipped[0].score == 1.0


def test_without_signals_nothing_more_is_asked(tmp_path):
    suite, target = FakeSuite(n=2), SeededTarget()
    asyncio.run(run_eval(suite, suite.load(), [target], progress=False, out_dir=tmp_path))
    assert len(target.params) == 2 and not any("logprobs" in p for p in target.params)
    assert all(r.signals is None for r in OutcomeTable.read(tmp_path / "outcomes.jsonl").rows)


@pytest.mark.parametrize("kwargs", [{"top_logprobs": 0}, {"top_logprobs": 21}, {"samples": -1}, {"temperature": 0}])
def test_signal_options_are_checked(kwargs):
    with pytest.raises(ValueError):
        SignalOptions(**kwargs)


def test_the_engine_reports_the_greedy_tokens_logprobs_through_the_gateway(tmp_path, link_home):
    """The real SmolLM2 through the in-process gateway: one log-probability per generated token, each the
    largest of its position's alternatives (greedy picks the argmax), all <= 0."""
    from evals.target_gateway import GatewayTarget, in_process_gateway
    from link.config import parse_config
    from tests.link.gateway_launch import gateway_settings

    config = parse_config({"models": [{"name": "smollm2-135m-instruct", "kind": "local", "local": "smollm2-135m-instruct"}]})
    settings = gateway_settings(f"sqlite:///{tmp_path / 'gw.db'}", tmp_path)

    async def go():
        async with in_process_gateway(settings, config) as gateway:
            target = GatewayTarget("smollm2-135m-instruct", gateway.client)
            return await target.chat([{"role": "user", "content": "What is 2 + 3?"}], temperature=0, max_tokens=12,
                                     logprobs=True, top_logprobs=5)

    completion = asyncio.run(go())
    assert completion.completion_tokens == len(completion.token_logprobs) == len(completion.top_logprobs) > 0
    for chosen, alternatives in zip(completion.token_logprobs, completion.top_logprobs):
        assert chosen <= 0.0 and len(alternatives) == 5
        assert chosen == pytest.approx(max(alternatives.values()), abs=1e-4)
