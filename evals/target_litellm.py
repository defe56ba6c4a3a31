"""Closed-model targets through LiteLLM ("openai/gpt-4o", "anthropic/claude-3-5-sonnet-20240620", ...).

    target = LiteLLMTarget("openai/gpt-4o")       # raises MissingCredentialsError naming OPENAI_API_KEY when unset
    completion = await target.chat([{"role": "user", "content": "2+2?"}], temperature=0, max_tokens=16)

The key is checked when the target is built, so a run fails before any call. Costs come from LiteLLM's
bundled price map (`LITELLM_LOCAL_MODEL_COST_MAP=True`: no download at import), else 0.
"""

from __future__ import annotations

import os
import time
from typing import Any

from evals.target_errors import target_error
from evals.targets import Completion, MissingCredentialsError, Prices, TargetError, token_logprobs_of, top_logprobs_of

# Known key variables by provider prefix, used when LiteLLM cannot tell (its own check comes first).
PROVIDER_KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY",
                 "mistral": "MISTRAL_API_KEY", "groq": "GROQ_API_KEY", "together_ai": "TOGETHERAI_API_KEY",
                 "deepseek": "DEEPSEEK_API_KEY", "cohere": "COHERE_API_KEY", "xai": "XAI_API_KEY"}


def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


def missing_key_variables(model: str) -> list[str]:
    """The environment variables `model` needs that are unset (empty when none or unknown)."""
    try:
        report = _litellm().validate_environment(model)
        missing = list(report.get("missing_keys") or [])
    except Exception:  # noqa: BLE001  (an unknown provider: fall back to the table)
        missing = []
    provider = model.split("/", 1)[0]
    if not missing and provider in PROVIDER_KEYS and not os.environ.get(PROVIDER_KEYS[provider]):
        missing = [PROVIDER_KEYS[provider]]
    return missing


def litellm_error(exc: Exception) -> TargetError:
    """Map a LiteLLM error to `TargetError` (retryable: timeouts, connection errors, 429, 5xx)."""
    mapped = target_error(exc)
    status = getattr(exc, "status_code", None)
    if mapped.status is None and isinstance(status, int):
        return TargetError(str(exc), retryable=status in (408, 429) or status >= 500, status=status)
    name = type(exc).__name__
    if not mapped.retryable and name in ("Timeout", "APIConnectionError", "RateLimitError", "ServiceUnavailableError",
                                         "InternalServerError"):
        return TargetError(f"{name}: {exc}", retryable=True, status=status if isinstance(status, int) else None)
    return mapped


class LiteLLMTarget:
    """A provider model called through `litellm.acompletion` / `litellm.atext_completion`.

    Args:
        model: a LiteLLM model string, "provider/model".
        api_base, api_key: override the provider's URL and key (tests; self-hosted endpoints).
        check_key: verify the provider's key variable now (default True).
    Raises:
        MissingCredentialsError: the key variable is unset (and no `api_key` given); the message names it.
        TargetError (from chat/complete): the call failed; `retryable` for timeouts, connection errors, 429, 5xx.
    """

    def __init__(self, model: str, *, api_base: str | None = None, api_key: str | None = None, check_key: bool = True):
        self.name = model
        self.api_base, self.api_key = api_base, api_key
        if check_key and api_key is None:
            missing = missing_key_variables(model)
            if missing:
                raise MissingCredentialsError(f"target {model!r} needs {' and '.join(missing)}: set "
                                              f"{'them' if len(missing) > 1 else 'it'} in the environment, or drop the target")
        self.prices = self._prices()

    def __repr__(self) -> str:
        return f"LiteLLMTarget({self.name!r})"

    def _prices(self) -> Prices | None:
        try:
            info = _litellm().get_model_info(self.name)
        except Exception:  # noqa: BLE001  (not in the price map)
            return None
        return Prices((info.get("input_cost_per_token") or 0.0) * 1e6, (info.get("output_cost_per_token") or 0.0) * 1e6)

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        """One chat completion (not streamed); `params` are OpenAI body fields."""
        return await self._call("chat", messages=messages, **params)

    async def complete(self, prompt: str, **params: Any) -> Completion:
        """One text completion (not streamed), for providers that offer it."""
        return await self._call("completion", prompt=prompt, **params)

    async def _call(self, kind: str, **request: Any) -> Completion:
        litellm = _litellm()
        request.pop("stream", None)
        extra = {k: v for k, v in (("api_base", self.api_base), ("api_key", self.api_key)) if v is not None}
        start = time.perf_counter()
        try:
            call = litellm.acompletion if kind == "chat" else litellm.atext_completion
            response = await call(model=self.name, **request, **extra)
        except Exception as exc:  # noqa: BLE001
            raise litellm_error(exc) from exc
        latency = time.perf_counter() - start
        choice = response.choices[0]
        if kind == "chat":
            message = choice.message
            text = message.content or ""
            calls = [c.model_dump() if hasattr(c, "model_dump") else dict(c) for c in message.tool_calls] \
                if getattr(message, "tool_calls", None) else None
        else:
            text, calls = choice.text or "", None
        usage = getattr(response, "usage", None)
        prompt_tokens = getattr(usage, "prompt_tokens", 0) or 0
        completion_tokens = getattr(usage, "completion_tokens", 0) or 0
        try:
            cost = float(litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # noqa: BLE001  (a model missing from the price map)
            cost = self.prices.cost_usd(prompt_tokens, completion_tokens) if self.prices else 0.0
        return Completion(text=text, tool_calls=calls, finish_reason=choice.finish_reason, model=response.model or self.name,
                          prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost_usd=cost, latency_s=latency,
                          top_logprobs=top_logprobs_of(choice, kind),
                          token_logprobs=token_logprobs_of(choice, kind))
