"""`resolve_targets`: `--target` names -> targets, the gateway's for what it serves, LiteLLM's for "provider/model".

    targets = resolve_targets(["smollm2-135m-instruct", "openai/gpt-4o"], gateway.cards, gateway.client,
                              prices=gateway.prices)

The one place that knows both kinds of target, so `targets.py` (the protocol and its types) imports neither.
"""

from __future__ import annotations

from typing import Any

from evals.target_gateway import GatewayTarget
from evals.target_litellm import LiteLLMTarget
from evals.targets import CallBound, Prices, Target


def resolve_targets(names: list[str], served: dict[str, Any], client: Any, *,
                    prices: dict[str, Prices] | None = None) -> list[Target]:
    """Targets for `--target` names, checked before any model is called.

    Args:
        names: target names in the order given; each once.
        served: the gateway's /v1/models cards by id (models and policies); the card's `link` dict may
            list a policy's `models` and, for a policy making several calls per request, its `cost_bound`
            (the models it may call and how many calls: the target's `prices` and `call_bound`).
        client: the `openai.AsyncOpenAI` that reaches the gateway (in-process or --base-url).
        prices: per-model prices known from the gateway's config (charged when the gateway sends no
            `x-link-cost-usd` header).
    Returns:
        `GatewayTarget` for served names; `LiteLLMTarget` for "provider/model" strings the gateway does not serve.
    Raises:
        MissingCredentialsError: a LiteLLM target whose key variable is unset (the message names it).
        ValueError: a name that is neither served nor a "provider/model" string; the message lists what is served.
    """
    prices = prices or {}
    targets: list[Target] = []
    for name in dict.fromkeys(names):
        if name in served:
            link = (served[name] or {}).get("link") or {}
            calls = link.get("cost_bound")
            models = (calls or {}).get("models") or link.get("models") or [name]
            bound = Prices.highest([prices[m] for m in models if m in prices]) if all(m in prices for m in models) else None
            targets.append(GatewayTarget(name, client, prices=bound, model_prices=prices,
                                         call_bound=CallBound.from_card(calls) if calls else None))
        elif "/" in name:
            targets.append(LiteLLMTarget(name))
        else:
            raise ValueError(f"unknown target {name!r}: the gateway serves {', '.join(sorted(served)) or 'nothing'}; "
                             "closed models are written provider/model (e.g. openai/gpt-4o)")
    return targets
