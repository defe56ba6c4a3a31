"""`link route "prompt" --policy P`: explain what a policy would do with one request, without calling a model.

    link route "What is 17 * 23?"                              # the embedded default's link/auto
    link route "Write a haiku" --policy link/moa --config link.yaml
    link route "..." --cost-penalty 50 --max-cost-usd 0.0001 --json

Prints each candidate's predicted quality, expected cost (USD) and objective (quality - lambda * cost) for
router and hybrid policies, the plan (models in order; MoA proposers and aggregator; cascade steps) for
every type. `explain_route` is the library function behind it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table


def explain_route(prompt: str, policy_name: str, config_path: str | None = None, *, cost_penalty: float | None = None,
                  max_cost_usd: float | None = None, suite: str | None = None, endpoint: str = "chat") -> dict[str, Any]:
    """Plan one request with a config policy (or a model name): {"policy", "type", "models" (the plan's order, or
    every model an executed plan calls), "decision", "executed" (a cascade or MoA plan)}.

    Args:
        prompt: the user message (chat) or the prompt (endpoint "completion").
        config_path: link.yaml (None: LINK_CONFIG, else the embedded default).
        cost_penalty, max_cost_usd: sent as the request's metadata overrides (link_cost_penalty, link_max_cost_usd).
        suite: sent as metadata.suite (routers with per-suite costs read it).
    Raises:
        link.config.ConfigError: an invalid config. LookupError: no such policy or model.
        link.policies.base.PolicyError: the policy cannot be built (e.g. its router file is missing).
    """
    from link.config import load_config
    from link.policies import PolicyRequest, make_policy
    from link.policies.fixed import implicit_fixed
    from link.settings import get_settings

    config = load_config(config_path or get_settings().config)
    names = tuple(config.model_names)
    if policy_name in names:
        policy = implicit_fixed(policy_name, names)
    elif config.policy(policy_name) is not None:
        policy = make_policy(config.policy(policy_name), names)
    else:
        available = [*names, *(p.name for p in config.policies)]
        raise LookupError(f"no policy or model named {policy_name!r}; the config has {', '.join(available)}")
    metadata = {k: str(v) for k, v in (("link_cost_penalty", cost_penalty), ("link_max_cost_usd", max_cost_usd),
                                       ("suite", suite)) if v is not None}
    body: dict[str, Any] = {"model": policy_name, **({"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat"
                                                      else {"prompt": prompt})}
    if metadata:
        body["metadata"] = metadata
    plan = asyncio.run(policy.plan(PolicyRequest(endpoint, body, names)))  # type: ignore[arg-type]
    return {"policy": plan.policy, "type": policy.type, "models": plan.models, "decision": plan.decision,
            "executed": plan.executor is not None}


def _render(result: dict[str, Any], console: Console) -> None:
    decision = result["decision"]
    scores, costs = decision.get("scores"), decision.get("expected_cost_usd")
    if scores:
        objective = decision.get("objective") or {}
        table = Table(title=f"{result['policy']} ({result['type']})")
        for column in ("model", "predicted quality", "expected cost (USD)", "objective", ""):
            table.add_column(column, justify="left" if column in ("model", "") else "right")
        for name in sorted(scores, key=lambda m: -objective.get(m, scores[m])):
            mark = "chosen" if name == decision.get("chosen") else ("excluded" if name in decision.get("excluded", []) else "")
            table.add_row(name, f"{scores[name]:.4f}", f"{costs.get(name, float('nan')):.3g}",
                          f"{objective[name]:.4f}" if name in objective else "-", mark)
        console.print(table)
        knob = (f"lambda (cost penalty) = {decision['cost_penalty']:g} quality points per USD" if "cost_penalty" in decision
                else f"threshold = {decision.get('threshold')}")
        console.print(f"{knob}; routing took {decision.get('routing_ms', 0):.1f} ms")
    if "proposers" in decision or "moa_plan" in decision:
        moa = decision.get("moa_plan") or decision
        proposers = ", ".join(p["model"] + (f" @ T={p['temperature']:g}" if p.get("temperature") is not None else "")
                              for p in moa["proposers"])
        console.print(f"Mixture-of-Agents: proposers {proposers} -> aggregator {moa['aggregator']}")
    if "thresholds" in decision:
        console.print(f"cascade: {' -> '.join(result['models'])}, scorer {decision['scorer']}, thresholds {decision['thresholds']}")
    if result.get("executed"):
        console.print(f"models called: {', '.join(result['models'])}", markup=False)
    else:
        console.print(f"plan: {' -> '.join(result['models'])} (the next one only on an error before the first byte)",
                      markup=False)


def route(
    prompt: str = typer.Argument(..., help="The user message to route."),
    policy: str = typer.Option("link/auto", "--policy", "-p", help="A policy (or model) name from the config."),
    config: str = typer.Option(None, "--config", "-c", help="link.yaml (default: LINK_CONFIG, else the embedded default)."),
    cost_penalty: float = typer.Option(None, "--cost-penalty", help="Override lambda (quality points per USD)."),
    max_cost_usd: float = typer.Option(None, "--max-cost-usd", help="Skip models expected to cost more (USD per request)."),
    suite: str = typer.Option(None, "--suite", help="The task label a router may read (metadata.suite)."),
    completion: bool = typer.Option(False, "--completion", help="Route it as a /v1/completions prompt."),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON."),
) -> None:
    """Explain a routing decision: each model's predicted quality and expected cost, and the plan."""
    from link.config import ConfigError
    from link.policies.base import PolicyError
    from link.schemas import OpenAIError

    try:
        result = explain_route(prompt, policy, config, cost_penalty=cost_penalty, max_cost_usd=max_cost_usd, suite=suite,
                               endpoint="completion" if completion else "chat")
    except (ConfigError, LookupError, PolicyError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(2) from None
    except OpenAIError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc.message}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        _render(result, Console())
