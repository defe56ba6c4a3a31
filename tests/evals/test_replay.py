"""Offline replay: recorded accuracy and cost reproduced, a learned policy, the oracle, and the mechanics."""

from __future__ import annotations

import asyncio

import pytest

from evals.outcomes import Outcome, OutcomeTable
from evals.recorded import load_routerbench
from evals.replay import areplay, build_policy, oracle, replay
from link.config import PolicyConfig
from link.policies.base import Plan, Policy, PolicyError, PolicyRequest
from tests.evals import routerbench_csv as ref
from tests.evals.best_per_task import BestPerTask


@pytest.fixture(scope="module")
def routerbench_test(data_dir) -> OutcomeTable:
    return load_routerbench(data_dir, "test")


@pytest.fixture(scope="module")
def routerbench_test_csv_rows(data_dir) -> list[dict[str, str]]:
    return ref.read(data_dir, "test")


def test_fixed_policies_reproduce_each_models_recorded_accuracy_and_cost(routerbench_test, routerbench_test_csv_rows):
    assert len(ref.models(routerbench_test_csv_rows)) == 11
    for model in ref.models(routerbench_test_csv_rows):
        n, accuracy, cost = ref.accuracy_and_cost(routerbench_test_csv_rows, model)
        result = replay(build_policy(model, routerbench_test.models), routerbench_test)
        assert result.num_prompts == n
        assert result.mean_score == pytest.approx(accuracy, abs=1e-12)
        assert result.total_cost_usd == pytest.approx(cost, rel=1e-12)
        assert result.pick_share == {model: 1.0}
        # the prompts a model has no recorded outcome for are skipped, not charged
        assert len(result.skipped) == len(routerbench_test.prompt_ids) - n


def test_learned_best_per_task_policy_gives_the_hand_computed_accuracy_and_cost(data_dir, routerbench_test):
    config = PolicyConfig(name="best-per-task", type="router", models=list(routerbench_test.models),
                          options={"data_dir": str(data_dir)})
    result = replay(BestPerTask(config, routerbench_test.models), routerbench_test)
    n, accuracy, cost = ref.best_per_task_expected(data_dir)
    assert (result.num_prompts, result.skipped) == (n, [])
    assert result.mean_score == pytest.approx(accuracy, abs=1e-12)
    assert result.total_cost_usd == pytest.approx(cost, rel=1e-12)
    assert set(result.outcomes.models) == {"best-per-task"}
    # gpt-4 is the training best on all three tasks; its 5 test holes fall back to the next-ranked model
    assert result.pick_share["gpt-4-1106-preview"] == pytest.approx(947 / 952)


def test_oracle_is_the_best_recorded_score_at_the_lowest_cost_per_prompt(routerbench_test, routerbench_test_csv_rows):
    filled, _ = ref.cells(routerbench_test_csv_rows)
    by_prompt: dict[str, list[tuple[float, float]]] = {}
    for (sample_id, _model), (score, cost) in filled.items():
        by_prompt.setdefault(sample_id, []).append((score, cost))
    best = {p: max(v, key=lambda sc: (sc[0], -sc[1])) for p, v in by_prompt.items()}
    result = oracle(routerbench_test)
    assert result.num_prompts == len(best) == 952
    assert result.mean_score == pytest.approx(sum(s for s, _ in best.values()) / len(best), abs=1e-12)
    assert result.total_cost_usd == pytest.approx(sum(c for _, c in best.values()), rel=1e-12)
    for model in ref.models(routerbench_test_csv_rows):
        assert result.mean_score >= ref.accuracy_and_cost(routerbench_test_csv_rows, model)[1]


def _table() -> OutcomeTable:
    rows = [("p1", "math", "a", 1.0, 0.5), ("p1", "math", "b", 0.0, 0.1),
            ("p2", "code", "b", 1.0, 0.2),
            ("p3", "code", "a", 0.0, 0.3), ("p3", "code", "b", 0.0, 0.0),
            ("p4", "math", "c", 1.0, 0.9)]
    return OutcomeTable(Outcome(p, s, f"prompt {p}", m, score, cost) for p, s, m, score, cost in rows)


class Spy(Policy):
    """Records every request; plans a then b; tracks how many plan() calls are in flight."""

    type = "router"

    def __init__(self, config, model_names):
        super().__init__(config, model_names)
        self.requests: list[PolicyRequest] = []
        self.in_flight = self.max_in_flight = 0

    async def plan(self, request: PolicyRequest) -> Plan:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.requests.append(request)
        return Plan(self.name, ["a", "b"])


def test_replay_falls_back_in_plan_order_skips_uncovered_prompts_and_relabels():
    table = _table()
    spy = Spy(PolicyConfig(name="spy", type="router", models=["a", "b"]), table.models)
    result = replay(spy, table, concurrency=2)
    assert result.picks == {"p1": "a", "p2": "b", "p3": "a"}
    assert result.skipped == ["p4"]
    assert result.mean_score == pytest.approx(2 / 3)
    assert result.total_cost_usd == pytest.approx(0.5 + 0.2 + 0.3)
    assert result.mean_cost_usd == pytest.approx(1.0 / 3)
    assert result.pick_share == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    assert [(o.prompt_id, o.model, o.score) for o in result.outcomes] == [("p1", "spy", 1.0), ("p2", "spy", 1.0), ("p3", "spy", 0.0)]
    assert spy.max_in_flight == 2
    request = next(r for r in spy.requests if r.body["metadata"]["prompt_id"] == "p2")
    assert request.endpoint == "chat" and request.model_names == ("a", "b", "c")
    assert request.body == {"model": "spy", "messages": [{"role": "user", "content": "prompt p2"}],
                            "metadata": {"suite": "code", "prompt_id": "p2"}}


def test_areplay_runs_inside_an_event_loop_and_checks_concurrency():
    table = _table()
    policy = build_policy("fallback:b,a", table.models)
    result = asyncio.run(areplay(policy, table, concurrency=1))
    assert result.picks == {"p1": "b", "p2": "b", "p3": "b"}
    with pytest.raises(ValueError, match="concurrency"):
        replay(policy, table, concurrency=0)


def test_oracle_breaks_ties_by_cost():
    result = oracle(_table())
    assert result.picks == {"p1": "a", "p2": "b", "p3": "b", "p4": "c"}  # p3: both 0, b is free
    assert result.total_cost_usd == pytest.approx(0.5 + 0.2 + 0.0 + 0.9)


def test_build_policy_specs():
    names = ("a", "b", "c")
    assert build_policy("a", names).type == "fixed"
    fallback = build_policy("fallback:b, c", names)
    assert (fallback.type, fallback.config.models, fallback.name) == ("fallback", ["b", "c"], "fallback:b, c")
    typed = build_policy("cheap", names, policy_type="fallback", models=["c", "a"])
    assert (typed.name, typed.config.models) == ("cheap", ["c", "a"])
    spy = build_policy("test_replay:Spy", names)
    assert isinstance(spy, Spy) and spy.name == "Spy" and spy.config.models == ["a", "b", "c"]
    for bad, message in [("zzz", "unknown policy"), ("fallback:a,zzz", "unknown model"), ("fixed:a,b", "exactly one"),
                         ("evals.outcomes:Outcome", "not a subclass"), ("no_such_module:X", "cannot import")]:
        with pytest.raises(PolicyError, match=message):
            build_policy(bad, names)
