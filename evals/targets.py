"""Targets: what a suite asks. A model or policy served by the gateway, or a closed model via LiteLLM.

    target = GatewayTarget("smollm2-135m-instruct", base_url="http://127.0.0.1:8000/v1", api_key="sk-...")
    completion = await target.chat([{"role": "user", "content": "2+2?"}], temperature=0, max_tokens=16)
    completion.text, completion.cost_usd, completion.latency_s

The `Target` protocol is all that suites and the runner rely on (`target_factory.resolve_targets` builds
targets from names); `Completion` is JSON-round-trippable
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
        top_logprobs: per generated token, its most likely alternatives {token text: natural-log
            probability}, when the request asked for logprobs (chat `top_logprobs`, completions `logprobs`).
        token_logprobs: per generated token, the natural-log probability of the token chosen, when the request
            asked for logprobs (the confidence signals of `routers.signals`).
    """

    text: str
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    top_logprobs: list[dict[str, float]] | None = None
    token_logprobs: list[float] | None = None


def top_logprobs_of(choice: Any, kind: str) -> list[dict[str, float]] | None:
    """The per-token alternatives of an OpenAI choice (an SDK object or a dict), or None when absent.

    Chat: `choice.logprobs.content[i].top_logprobs[j].{token, logprob}`; completions:
    `choice.logprobs.top_logprobs[i]` ({token: logprob}).
    """
    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    logprobs = get(choice, "logprobs")
    if logprobs is None:
        return None
    if kind == "chat":
        positions = get(logprobs, "content") or []
        return [{get(t, "token"): float(get(t, "logprob")) for t in (get(p, "top_logprobs") or [])} for p in positions]
    return [dict(position or {}) for position in (get(logprobs, "top_logprobs") or [])]


def token_logprobs_of(choice: Any, kind: str) -> list[float] | None:
    """The log-probability of each chosen token of an OpenAI choice (an SDK object or a dict), or None when absent.

    Chat: `choice.logprobs.content[i].logprob`; completions: `choice.logprobs.token_logprobs[i]` (a null entry,
    the first token of an echoed prompt, is skipped).
    """
    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    logprobs = get(choice, "logprobs")
    if logprobs is None:
        return None
    values = ([get(p, "logprob") for p in (get(logprobs, "content") or [])] if kind == "chat"
              else list(get(logprobs, "token_logprobs") or []))
    out = [float(v) for v in values if v is not None]
    return out or None


@runtime_checkable
class Target(Protocol):
    """Something that answers OpenAI-style requests. `params` are OpenAI body fields
    (temperature, max_tokens, seed, stop, tools, tool_choice, ...). Errors: `TargetError`."""

    name: str

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion: ...

    async def complete(self, prompt: str, **params: Any) -> Completion: ...


class ParamsTarget:
    """A target whose calls get extra OpenAI body fields: `defaults` where the call does not set them (chat and
    completion defaults apart, as their logprob fields differ), then `overrides` over whatever it set.

        ParamsTarget(target, chat_defaults={"logprobs": True, "top_logprobs": 5}, completion_defaults={"logprobs": 5})
        ParamsTarget(target, overrides={"temperature": 0.7, "seed": 3})      # a sampled answer of a greedy suite
    """

    def __init__(self, target: Target, *, chat_defaults: dict[str, Any] | None = None,
                 completion_defaults: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None):
        self.target, self.name = target, target.name
        self.chat_defaults, self.completion_defaults = dict(chat_defaults or {}), dict(completion_defaults or {})
        self.overrides = dict(overrides or {})

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        return await self.target.chat(messages, **{**self.chat_defaults, **params, **self.overrides})

    async def complete(self, prompt: str, **params: Any) -> Completion:
        return await self.target.complete(prompt, **{**self.completion_defaults, **params, **self.overrides})


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
    the priciest candidate), and `call_bound: CallBound | None` when one request makes several calls. The
    runner reserves a call's cost bound from them before launching it (--max-cost).
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


@dataclass(frozen=True)
class CallBound:
    """How many calls one request to a multi-call policy (MoA, cascade, hybrid) can make, from its /v1/models
    card's `link.cost_bound` (link.policies.base.CostBound): at most `calls` calls, each reading the prompt plus
    `prompt_tokens_per_max_token` x max_tokens plus `extra_prompt_tokens`, each writing at most max_tokens."""

    calls: int = 1
    prompt_tokens_per_max_token: int = 0
    extra_prompt_tokens: int = 0

    @classmethod
    def from_card(cls, bound: dict[str, Any]) -> CallBound:
        """From a card's `cost_bound` dict. Raises ValueError for a malformed one."""
        try:
            out = cls(int(bound["calls"]), int(bound.get("prompt_tokens_per_max_token", 0)),
                      int(bound.get("extra_prompt_tokens", 0)))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"malformed cost_bound on a policy card: {bound!r}") from None
        if out.calls < 1 or out.prompt_tokens_per_max_token < 0 or out.extra_prompt_tokens < 0:
            raise ValueError(f"malformed cost_bound on a policy card: {bound!r}")
        return out
