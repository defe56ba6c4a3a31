"""`LiteLLMBackend`: any provider LiteLLM supports, by its model string ("openai/gpt-4o-mini", ...).

Calls `litellm.acompletion` (chat) or `litellm.atext_completion` (completion) with the deployment's
`api_base` and the key read from the environment variable named by `api_key_env`. LiteLLM's own
retries are off: retries and fallbacks are the gateway's decision. Answers come back as plain dicts
in OpenAI's shape, without LiteLLM's extra bookkeeping fields.

Keys: with `api_key_env` the key comes from that variable; without it, a deployment with an
`api_base` sends a dummy key (a loopback server that checks none) and one without lets LiteLLM read
the provider's usual variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote price-map fetch at import

from typing import Any, AsyncIterator  # noqa: E402

import litellm  # noqa: E402

import openai  # noqa: E402

from link.backends.base import Backend, BackendError, Endpoint, guard_stream, with_timeout  # noqa: E402
from link.backends.openai_compat import OpenAICompatBackend, api_key, map_openai_error  # noqa: E402
from link.config import ModelDeployment  # noqa: E402

# Fields LiteLLM adds to OpenAI's objects; dropped so clients see OpenAI's shape.
_EXTRA_FIELDS = ("provider_specific_fields", "citations", "moderation", "obfuscation", "reasoning_content")
# Request fields LiteLLM interprets itself instead of sending them to the provider.
_LOCAL_FIELDS = ("metadata",)


def _clean(obj: dict) -> dict:
    """Drop LiteLLM-only fields, and null fields of messages and deltas, from a response or chunk dict."""
    for key in _EXTRA_FIELDS:
        obj.pop(key, None)
    for choice in obj.get("choices") or ():
        for key in _EXTRA_FIELDS:
            choice.pop(key, None)
        if isinstance(choice.get("delta"), dict):
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None and k not in _EXTRA_FIELDS}
        if isinstance(choice.get("message"), dict):
            message = choice["message"]
            choice["message"] = {k: v for k, v in message.items() if k not in _EXTRA_FIELDS and (v is not None or k == "content")}
    return obj


class LiteLLMBackend(Backend):
    """One provider deployment reached through LiteLLM."""

    def __init__(self, deployment: ModelDeployment):
        super().__init__(deployment)
        litellm.suppress_debug_info = True  # no "Give Feedback" banners on provider errors
        self._probe: Backend | None = None  # an HTTP client for health checks of an api_base, made on first use

    def _kwargs(self, body: dict) -> dict[str, Any]:
        d = self.deployment
        kwargs = {k: v for k, v in body.items() if k not in _LOCAL_FIELDS}
        kwargs.setdefault("model", d.provider_model)
        key = api_key(d)
        if key is None and d.api_base:
            key = "unused"
        kwargs.update(api_base=d.api_base, timeout=d.timeout_s, num_retries=0, max_retries=0)
        if key is not None:
            kwargs["api_key"] = key
        return kwargs

    async def complete(self, endpoint: Endpoint, body: dict) -> dict:
        """The whole response dict. Raises BackendError (see `Backend`)."""
        kwargs = self._kwargs(body)
        kwargs.pop("stream_options", None)
        kwargs["stream"] = False
        call = litellm.acompletion if endpoint == "chat" else litellm.atext_completion
        try:
            response = await with_timeout(call(**kwargs), self.deployment)
        except Exception as exc:
            raise _mapped(exc, self.deployment).redacted(self.redactor) from exc
        return _clean(response.model_dump())

    async def stream(self, endpoint: Endpoint, body: dict) -> AsyncIterator[dict]:
        """Yield chunk dicts under the deployment's timeouts. Raises BackendError (see `Backend`)."""
        kwargs = self._kwargs(body)
        kwargs["stream"] = True
        async for chunk in guard_stream(self._chunks(endpoint, kwargs), self.deployment):
            yield chunk

    async def _chunks(self, endpoint: Endpoint, kwargs: dict) -> AsyncIterator[dict]:
        call = litellm.acompletion if endpoint == "chat" else litellm.atext_completion
        num_chunks = 0
        try:
            response = await call(**kwargs)
            async for chunk in response:
                num_chunks += 1
                data = _clean(chunk.model_dump())
                usage = data.get("usage")
                if usage and data.get("choices"):
                    # Some LiteLLM versions put the usage on the last content chunk; OpenAI sends it alone,
                    # with empty `choices`, after the chunk that carries finish_reason.
                    yield {**data, "usage": None}
                    data = {**data, "choices": [], "usage": usage}
                yield data
        except Exception as exc:
            raise _mapped(exc, self.deployment, num_chunks).redacted(self.redactor) from exc

    async def health(self) -> bool:
        """With an `api_base`: GET its /health (or /models); a hosted provider is assumed up (no free probe)."""
        if not self.deployment.api_base:
            return True
        if self._probe is None:
            self._probe = OpenAICompatBackend(self.deployment)
        return await self._probe.health()

    async def aclose(self) -> None:
        if self._probe is not None:
            await self._probe.aclose()


def _mapped(exc: Exception, deployment: ModelDeployment, num_chunks: int = 0) -> BackendError:
    """LiteLLM's exceptions subclass `openai`'s; anything else (a LiteLLM bug) becomes a retryable 502."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, openai.OpenAIError):
        return map_openai_error(exc, deployment, num_chunks)
    return BackendError(f"{deployment.name}: {type(exc).__name__}: {exc}", status_code=502, retryable=True)
