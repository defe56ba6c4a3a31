"""`link route "prompt" --policy P`: explain what a policy would do with one request, without calling a model.

    link route "What is 17 * 23?"                              # the embedded default's link/auto
    link route "Write a haiku" --policy link/moa --config link.yaml
    link route "..." --cost-penalty 50 --max-cost-usd 0.0001 --json
    link route "Weather in Paris?" --tools tools.json            # the request offers these OpenAI tools

Prints each candidate's predicted quality, expected cost (USD) and objective (quality - lambda * cost) for
router and hybrid policies, the plan (models in order; MoA proposers and aggregator; cascade steps) for
every type. `explain_route` is the library function behind it. A cold start loads the policy's router file and
the prompt encoder (seconds): a status line on stderr names them (`loading_note`), so stdout stays the answer.

`--tools` reads a JSON file holding a list of OpenAI tools ({"type": "function", "function": {"name", ...}})
or a saved chat request body with a "tools" key (`load_tools`). A request offering tools can be routed
differently: the kNN router looks for neighbours among prompts of the request's kind (routers/knn.py).
Bad input (a missing or malformed tools file, tools with --completion, an unknown policy) prints one line
`error: ...` and exits with code 2.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable

import typer
from rich.console import Console
from rich.table import Table

from cli.errors import fail
from cli.progress import status
from cli.tables import print_table
from link.money import format_usd
from evals.event_loop import run_sync


def check_tools(tools: Any, where: str = "tools") -> list[dict]:
    """`tools` itself when it is a non-empty list of OpenAI function tools, each {"type": "function",
    "function": {"name": str, ...}}; the gateway's schema checks the rest (name pattern, parameters).

    Args:
        where: the name of the list in messages ("tools", "tools.json").
    Raises:
        ValueError: naming the first tool at fault (`where`[i]) and what it lacks.
    """
    from protocol.chat_fields import json_type

    shape = '{"type": "function", "function": {"name": ...}}'
    if not isinstance(tools, list) or not tools:
        kind = "an empty array" if tools == [] else json_type(tools)
        raise ValueError(f"{where} must be a non-empty array of OpenAI tools {shape}, not {kind}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"{where}[{i}] must be an object {shape}, not {json_type(tool)}")
        if tool.get("type") != "function":
            raise ValueError(f'{where}[{i}].type must be "function", not {json.dumps(tool.get("type"))}')
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"{where}[{i}].function.name is missing: each tool needs {shape}")
    return tools


def load_tools(path: str | Path) -> list[dict]:
    """The OpenAI tools in a JSON file: a list of tools, or an object with a "tools" list (a saved request body).

    Raises:
        ValueError: no such file, not UTF-8 JSON (the decoder's line and column), no "tools" key in an object,
            or tools that `check_tools` refuses; each message starts with the path.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"{path}: no such tools file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    if isinstance(data, dict):
        if "tools" not in data:
            raise ValueError(f'{path} is a JSON object without a "tools" key; give a list of OpenAI tools or a '
                             'request body with "tools"')
        return check_tools(data["tools"], f"{path}: tools")
    return check_tools(data, str(path))


# The files a policy type loads on its first plan, by option: what `loading_note` names.
_LOADED_FILES = {"path": "router file", "checker": "answer checker file"}


def loading_note(policy) -> str | None:
    """What planning with `policy` (a `link.config.PolicyConfig`) loads first: "loading link/auto: router file
    <path>, prompt encoder all-MiniLM-L6-v2 (auto)"; None when it loads no file (fixed, fallback, MoA)."""
    from routers.embedding import DEFAULT_MODEL_NAME

    files = [f"{what} {policy.options[key]}" for key, what in _LOADED_FILES.items()
             if isinstance(policy.options.get(key), str)]
    if not files:
        return None
    return (f"loading {policy.name}: {', '.join(files)}, prompt encoder {DEFAULT_MODEL_NAME} "
            f"({policy.options.get('encoder') or 'auto'}) ...")


def explain_route(prompt: str, policy_name: str, config_path: str | None = None, *, cost_penalty: float | None = None,
                  max_cost_usd: float | None = None, suite: str | None = None, endpoint: str = "chat",
                  tools: list[dict] | None = None, on_load: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Plan one request with a config policy (or a model name): {"policy", "type", "models" (the plan's order, or
    every model an executed plan calls), "decision", "executed" (a cascade or MoA plan), "tools" (the names of
    the functions the request offers)}; a cascade scored by a router's predicted quality, decided before any
    call, also gives "steps" (`link.policies.cascade.predicted_steps`) and "models" is then the one model called.

    Args:
        prompt: the user message (chat) or the prompt (endpoint "completion").
        config_path: link.yaml (None: LINK_CONFIG, else the embedded default).
        cost_penalty, max_cost_usd: sent as the request's metadata overrides (link_cost_penalty, link_max_cost_usd).
        suite: sent as metadata.suite (routers with per-suite costs read it).
        tools: OpenAI tools the request offers, [{"type": "function", "function": {"name", ...}}] (chat only).
        on_load: called with `loading_note` before the policy loads its files (none: not called).
    Raises:
        link.config.ConfigError: an invalid config. LookupError: no such policy or model.
        link.policies.base.PolicyError: the policy cannot be built (e.g. its router file is missing).
        ValueError: tools with endpoint "completion", or tools `check_tools` refuses.
        link.schemas.OpenAIError: a body the gateway would refuse (e.g. a function name with a space).
    """
    from link.config import load_config
    from link.policies import PolicyRequest, make_policy
    from link.policies.cascade import predicted_steps
    from link.policies.fixed import implicit_fixed
    from link.schemas import validate_request
    from link.settings import get_settings

    if tools is not None and endpoint != "chat":
        raise ValueError(f"tools need the chat endpoint, not {endpoint!r} (a /v1/completions prompt offers none)")
    metadata = {k: str(v) for k, v in (("link_cost_penalty", cost_penalty), ("link_max_cost_usd", max_cost_usd),
                                       ("suite", suite)) if v is not None}
    body: dict[str, Any] = {"model": policy_name, **({"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat"
                                                      else {"prompt": prompt})}
    if metadata:
        body["metadata"] = metadata
    if tools is not None:
        body["tools"] = check_tools(tools)
    validate_request(body, endpoint)  # what the gateway refuses before planning (link/routes/route.py)
    config = load_config(config_path or get_settings().config)
    names = tuple(config.model_names)
    if policy_name in names:
        policy = implicit_fixed(policy_name, names)
    elif config.policy(policy_name) is not None:
        note = loading_note(config.policy(policy_name))
        if note is not None and on_load is not None:
            on_load(note)
        policy = make_policy(config.policy(policy_name), names)
    else:
        available = [*names, *(p.name for p in config.policies)]
        raise LookupError(f"no policy or model named {policy_name!r}; the config has {', '.join(available)}")
    # asyncio.run, in a worker thread when called inside a running loop (a notebook): evals/event_loop.py
    plan = run_sync(policy.plan(PolicyRequest(endpoint, body, names)))  # type: ignore[arg-type]
    result = {"policy": plan.policy, "type": policy.type, "models": plan.models, "decision": plan.decision,
              "executed": plan.executor is not None, "tools": [t["function"]["name"] for t in tools or []]}
    steps = predicted_steps(plan.executor, body)
    if steps is not None:
        result["steps"] = steps
        result["models"] = [next(step["model"] for step in steps if step["status"] == "answers")]
    return result


def _render(result: dict[str, Any], console: Console) -> None:
    decision = result["decision"]
    if result["tools"]:
        console.print(f"the request offers tools: {', '.join(result['tools'])}", markup=False)
    scores, costs = decision.get("scores"), decision.get("expected_cost_usd")
    if scores:
        objective = decision.get("objective") or {}
        table = Table(title=f"{result['policy']} ({result['type']})")
        for column in ("model", "predicted quality", "expected cost", "objective", ""):
            table.add_column(column, justify="left" if column in ("model", "") else "right")
        for name in sorted(scores, key=lambda m: -objective.get(m, scores[m])):
            mark = "chosen" if name == decision.get("chosen") else ("excluded" if name in decision.get("excluded", []) else "")
            table.add_row(name, f"{scores[name]:.4f}", format_usd((costs or {}).get(name)),
                          f"{objective[name]:.4f}" if name in objective else "-", mark)
        print_table(table, console)
        knob = (f"lambda (cost penalty) = {decision['cost_penalty']:g} quality points per USD" if "cost_penalty" in decision
                else f"threshold = {decision.get('threshold')}")
        console.print(f"{knob}; routing took {decision.get('routing_ms', 0):.1f} ms (loading the router not counted)")
        if decision.get("over_max_cost"):
            console.print(f"every candidate is expected to cost more than the ceiling of {decision['max_cost_usd']:g} USD: "
                          f"the cheapest, {decision['chosen']}, answers (the answer carries x-link-over-max-cost: true)",
                          markup=False)
    if "proposers" in decision or "moa_plan" in decision:
        moa = decision.get("moa_plan") or decision
        proposers = ", ".join(p["model"] + (f" @ T={p['temperature']:g}" if p.get("temperature") is not None else "")
                              for p in moa["proposers"])
        console.print(f"Mixture-of-Agents: proposers {proposers} -> aggregator {moa['aggregator']}")
    if "steps" in result:
        for step in result["steps"]:
            verdict = "skipped: predicted under its threshold" if step["status"] == "skipped" else step["status"]
            if step["threshold"] is None:
                console.print(f"cascade step {step['model']} (the last): {verdict}", markup=False)
            else:
                console.print(f"cascade step {step['model']}: predicted quality {step['predicted_quality']:.4f}, threshold "
                              f"{step['threshold']:g}: {verdict}", markup=False)
    elif "thresholds" in decision:
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
    tools_path: str = typer.Option(None, "--tools", help="A JSON file of OpenAI tools (a list, or a request body "
                                                         "with \"tools\") the request offers."),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON."),
) -> None:
    """Explain a routing decision: each model's predicted quality and expected cost, and the plan."""
    from link.config import ConfigError
    from link.policies.base import PolicyError
    from link.schemas import OpenAIError

    from link.policies.router import MAX_COST_PENALTY, MAX_COST_USD

    for flag, value, high in (("--cost-penalty", cost_penalty, MAX_COST_PENALTY), ("--max-cost-usd", max_cost_usd, MAX_COST_USD)):
        if value is not None and not 0 <= value <= high:
            raise fail(f"{flag} must be a number in [0, {high:g}], got {value:g}")
    try:
        tools = None if tools_path is None else load_tools(tools_path)
        with contextlib.ExitStack() as loading:  # a spinner on stderr from the note until the plan is made
            result = explain_route(prompt, policy, config, cost_penalty=cost_penalty, max_cost_usd=max_cost_usd,
                                   suite=suite, endpoint="completion" if completion else "chat", tools=tools,
                                   on_load=lambda note: loading.enter_context(status(note)))
    except (ConfigError, LookupError, PolicyError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    except OpenAIError as exc:
        raise fail(exc.message) from None
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        _render(result, Console())
