"""Offline replay: a routing policy evaluated on an outcome table without calling any model.

    table = load_recorded("routerbench:test", data_dir)
    result = replay(build_policy("fallback:claude-instant-v1,gpt-4-1106-preview", table.models), table)
    result.mean_score, result.total_cost_usd, result.pick_share
    result.outcomes            # an OutcomeTable whose model column is the policy's name

For every prompt the policy gets the request the gateway would give it (`link.policies.base.PolicyRequest`:
the prompt as one user message, `metadata.suite` and `metadata.prompt_id` in the body, the table's models
as the served names) and the recorded score and cost of its first planned model that has an outcome for
the prompt are charged (later models in `plan.models` are the fallbacks, as in the gateway). A prompt that
no planned model covers is skipped and listed in `PolicyReplay.skipped`: recorded sets have holes (six
RouterBench ARC test prompts carry one model only), so a fixed policy scores exactly its model's
recorded rows. The policy interface is the gateway's, so the learned routers plug in unchanged.

A plan that makes several calls per request (a `PlanExecutor`: cascade, Mixture-of-Agents, a hybrid's MoA
option) is charged the one recorded answer that is its answer (`PlanExecutor.replay_model`): a cascade
scored by the router's predicted quality, its first step predicted at or above the threshold (the skipped
steps cost nothing); a MoA, the outcomes recorded under its own name (a hybrid: under its MoA column) by
`link eval run`. Otherwise (a judge-scored cascade, a MoA the table never recorded) `replay` raises
`ReplayError`: sweep a cascade offline with `link router eval` (its cascade:<router> entries) or measure
the policy live with `link eval run`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field, replace

from evals.event_loop import run_sync
from evals.outcomes import Outcome, OutcomeTable
from evals.policy_spec import build_policy  # noqa: F401  (re-exported: replay(build_policy(spec, ...), table))
from link.policies.base import Plan, Policy, PolicyRequest

DEFAULT_CONCURRENCY = 16


@dataclass
class PolicyReplay:
    """What a policy scored on a table.

    Attributes:
        policy: the policy's name (the model column of `outcomes`).
        picks: prompt_id -> the model charged, in the table's prompt order (skipped prompts absent).
        outcomes: the charged outcomes, relabelled with the policy's name (score, cost, tokens, latency and
            response are the picked model's).
        skipped: prompt ids that no planned model covers.
    """

    policy: str
    picks: dict[str, str]
    outcomes: OutcomeTable
    skipped: list[str] = field(default_factory=list)

    @property
    def num_prompts(self) -> int:
        return len(self.picks)

    @property
    def mean_score(self) -> float:
        return sum(o.score for o in self.outcomes) / len(self.outcomes) if len(self.outcomes) else float("nan")

    @property
    def total_cost_usd(self) -> float:
        return sum(o.cost_usd for o in self.outcomes)

    @property
    def mean_cost_usd(self) -> float:
        return self.total_cost_usd / len(self.outcomes) if len(self.outcomes) else float("nan")

    @property
    def pick_share(self) -> dict[str, float]:
        """model -> share of the replayed prompts routed to it, most picked first."""
        counts = Counter(self.picks.values())
        return {m: n / self.num_prompts for m, n in counts.most_common()}


class ReplayError(ValueError):
    """A policy whose answers the outcome table cannot price (see the module docstring)."""


def _executor_model(policy: Policy, plan: Plan, body: dict, table_models: list[str]) -> str:
    """The recorded column a plan with an executor is charged. Raises ReplayError when there is none."""
    how = ("sweep a cascade offline with `link router eval` (its cascade:<router> entries, over the same models) "
           f"or measure the policy live with `link eval run --target {policy.name}`")
    model = plan.executor.replay_model(body)
    if model is None:
        raise ReplayError(f"policy {policy.name!r} ({policy.type}) makes several model calls per request and its "
                          f"answer is no single recorded answer, so an outcome table cannot replay it: {how}")
    if model not in table_models:
        raise ReplayError(f"policy {policy.name!r} ({policy.type}) is replayed from the outcomes recorded as "
                          f"{model!r}, which the table lacks (it has {', '.join(table_models)}): {how}")
    return model


def _index(table: OutcomeTable) -> dict[tuple[str, str], Outcome]:
    return {(o.prompt_id, o.model): o for o in table}


def policy_request(prompt_id: str, suite: str, prompt: str, policy_name: str, model_names: tuple[str, ...]) -> PolicyRequest:
    """The chat request a policy sees for one recorded prompt."""
    body = {"model": policy_name, "messages": [{"role": "user", "content": prompt}],
            "metadata": {"suite": suite, "prompt_id": prompt_id}}
    return PolicyRequest(endpoint="chat", body=body, model_names=model_names)


async def areplay(policy: Policy, table: OutcomeTable, *, concurrency: int = DEFAULT_CONCURRENCY) -> PolicyReplay:
    """`replay` for callers inside an event loop."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    index, prompts, models = _index(table), table.prompts(), table.models
    gate = asyncio.Semaphore(concurrency)

    async def plan(prompt_id: str) -> list[str]:
        suite, prompt = prompts[prompt_id]
        request = policy_request(prompt_id, suite, prompt, policy.name, models)
        async with gate:
            planned = await policy.plan(request)
            if planned.executor is None:
                return planned.models
            return [await asyncio.to_thread(_executor_model, policy, planned, request.body, models)]

    plans = await asyncio.gather(*(plan(p) for p in table.prompt_ids))
    picks: dict[str, str] = {}
    rows: list[Outcome] = []
    skipped: list[str] = []
    for prompt_id, planned in zip(table.prompt_ids, plans):
        chosen = next((m for m in planned if (prompt_id, m) in index), None)
        if chosen is None:
            skipped.append(prompt_id)
            continue
        picks[prompt_id] = chosen
        rows.append(replace(index[(prompt_id, chosen)], model=policy.name))
    return PolicyReplay(policy.name, picks, OutcomeTable(rows), skipped)


def replay(policy: Policy, table: OutcomeTable, *, concurrency: int = DEFAULT_CONCURRENCY) -> PolicyReplay:
    """Evaluate `policy` on `table`: it plans every prompt, the first planned model with a recorded outcome
    is charged (see the module docstring).

    Args:
        policy: any `link.policies.base.Policy` built against `table.models`.
        table: recorded outcomes (one prompt may lack some models).
        concurrency: `plan` calls in flight at once (routers may embed the prompt).
    Returns:
        a `PolicyReplay`.
    Raises:
        ValueError: concurrency < 1. ReplayError: a multi-call plan the table cannot price (the module
            docstring). A policy's own errors propagate.
    Runs its own event loop (`asyncio.run`), in a worker thread when called inside a running loop (a notebook:
    evals/event_loop.py); a coroutine can await `areplay` instead.
    """
    return run_sync(areplay(policy, table, concurrency=concurrency))


def oracle(table: OutcomeTable, name: str = "oracle") -> PolicyReplay:
    """The oracle router: per prompt the best recorded score, the cheapest model among those tied
    (then the table's model order). An upper bound on any policy's score over the same models."""
    order = {m: i for i, m in enumerate(table.models)}
    best: dict[str, Outcome] = {}
    for o in table:
        current = best.get(o.prompt_id)
        key = (-o.score, o.cost_usd, order[o.model])
        if current is None or key < (-current.score, current.cost_usd, order[current.model]):
            best[o.prompt_id] = o
    picks = {p: best[p].model for p in table.prompt_ids}
    return PolicyReplay(name, picks, OutcomeTable(replace(best[p], model=name) for p in table.prompt_ids))
