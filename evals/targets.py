"""Targets: what a suite asks. A model or policy served by the gateway, or a closed model via LiteLLM.

    target = GatewayTarget("smollm2-135m-instruct", base_url="http://127.0.0.1:8000/v1", api_key="sk-...")
    completion = await target.chat([{"role": "user", "content": "2+2?"}], temperature=0, max_tokens=16)
    completion.text, completion.cost_usd, completion.latency_s

The `Target` protocol is all that suites and the runner rely on; `Completion` is JSON-round-trippable
(`dataclasses.asdict` / `Completion(**d)`) so the runner caches it in the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Completion:
    """One response of a target.

    Attributes:
        text: the message content (chat) or the completion text; "" when the model only called tools.
        tool_calls: OpenAI `tool_calls` as dicts ({"id", "type": "function", "function": {"name", "arguments"}})
            or None.
        finish_reason: OpenAI's ("stop", "length", "tool_calls", ...).
        model: the model that answered (a policy target may route to several).
        prompt_tokens, completion_tokens: usage reported by the server.
        cost_usd: USD charged for this call (0 when the server reports no price).
        latency_s: seconds from sending the request to the complete response.
    """

    text: str
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


@runtime_checkable
class Target(Protocol):
    """Something that answers OpenAI-style requests. `params` are OpenAI body fields
    (temperature, max_tokens, seed, stop, tools, tool_choice, ...). Errors: `TargetError`."""

    name: str

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion: ...

    async def complete(self, prompt: str, **params: Any) -> Completion: ...


class TargetError(RuntimeError):
    """A target call failed. `retryable` is True for timeouts, connection errors, 429 and 5xx; `status` is the
    HTTP status when the server answered; `reason` says why a connection failed ("connection refused")."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.retryable, self.status, self.reason = retryable, status, reason


class MissingCredentialsError(ValueError):
    """A closed-model target whose API key variable is not set; the message names the variable."""


@dataclass(frozen=True)
class Prices:
    """USD per million prompt (input) and completion (output) tokens of a model.

    Targets may carry `prices: Prices | None`: the highest prices any of their calls can be charged (a policy:
    the priciest candidate). The runner reserves a call's cost bound from them before launching it (--max-cost).
    """

    input_per_million: float = 0.0
    output_per_million: float = 0.0

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for a call: tokens x price / 1e6."""
        return (prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million) / 1e6

    @staticmethod
    def highest(prices: list[Prices]) -> Prices | None:
        """Component-wise maximum (an upper bound over several models); None for an empty list."""
        if not prices:
            return None
        return Prices(max(p.input_per_million for p in prices), max(p.output_per_million for p in prices))


def resolve_targets(names: list[str], served: dict[str, Any], client: Any, *,
                    prices: dict[str, Prices] | None = None) -> list[Target]:
    """Targets for `--target` names, checked before any model is called.

    Args:
        names: target names in the order given; each once.
        served: the gateway's /v1/models cards by id (models and policies); the card's `link` dict may
            list a policy's `models`.
        client: the `openai.AsyncOpenAI` that reaches the gateway (in-process or --base-url).
        prices: per-model prices known from the gateway's config (charged when the gateway sends no
            `x-link-cost-usd` header).
    Returns:
        `GatewayTarget` for served names; `LiteLLMTarget` for "provider/model" strings the gateway does not serve.
    Raises:
        MissingCredentialsError: a LiteLLM target whose key variable is unset (the message names it).
        ValueError: a name that is neither served nor a "provider/model" string; the message lists what is served.
    """
    from evals.target_gateway import GatewayTarget
    from evals.target_litellm import LiteLLMTarget

    prices = prices or {}
    targets: list[Target] = []
    for name in dict.fromkeys(names):
        if name in served:
            link = (served[name] or {}).get("link") or {}
            models = link.get("models") or [name]
            bound = Prices.highest([prices[m] for m in models if m in prices]) if all(m in prices for m in models) else None
            targets.append(GatewayTarget(name, client, prices=bound, model_prices=prices))
        elif "/" in name:
            targets.append(LiteLLMTarget(name))
        else:
            raise ValueError(f"unknown target {name!r}: the gateway serves {', '.join(sorted(served)) or 'nothing'}; "
                             "closed models are written provider/model (e.g. openai/gpt-4o)")
    return targets
