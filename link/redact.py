"""Secrets out of error texts: provider keys, the master key and URL credentials become "[redacted]".

    redactor = Redactor.from_config(settings, config)   # once, in the lifespan (link/state.py)
    redactor.redact("Incorrect API key provided: prov-8f3a...")   # -> "Incorrect API key provided: [redacted]"
    redactor.redact_json({"error": {"message": ...}})             # every string inside a JSON value
    log_filter = attach_log_filter(redactor) ... detach_log_filter(log_filter)   # the lifespan's logs

A provider echoes the key it was sent ("Incorrect API key provided: KEY"), and a connection error names the
`api_base`, credentials included ("http://user:password@host/v1"); passed on verbatim, any key holder reads
them and the request log stores them. What is replaced, in one pass over the text:
1. literal secrets (`secrets_of`): the value of every environment variable a configured model reads its key from
   (`api_key_env`; a LiteLLM deployment without one and without `api_base` reads the provider's own variable,
   so every variable named like `*_API_KEY` counts), the master key, and the credentials of every configured URL
   (`api_base`, `database_url`, `redis_url`). Values shorter than `MIN_SECRET_CHARS` are left alone: replacing
   a short word everywhere would garble every message, and such a value guards nothing.
2. the userinfo of any URL: "http://user:pw@host" -> "http://[redacted]@host".
3. the token shapes providers use (`TOKEN_PATTERNS`: "sk-...", "Bearer ...", "api_key=...", ...), for keys
   the gateway does not know (a provider echoing a key LiteLLM found elsewhere). The whole token goes, not
   OpenAI's "sk-...abcd": a visible suffix helps nobody reading an error and narrows a search for the key.

Where it runs, the narrow points every such text passes: the remote backends' error mapping (a
`BackendError`'s message and provider error object: link/backends/), the request-log row (its error and
decision: link/accounting.py), `/api/models`' `api_base`, and the records of our loggers and of the HTTP and
provider client libraries, which log URLs and provider errors (`attach_log_filter`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8
# Variables LiteLLM reads a provider's key from when a deployment names none (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).
PROVIDER_KEY_SUFFIXES = ("_API_KEY", "_API_TOKEN", "_SECRET_ACCESS_KEY", "_AUTH_TOKEN")
# Group `keep` (when present) is written back before REDACTED: the scheme of a URL, "Bearer ", "api_key=".
TOKEN_PATTERNS = (
    r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#@'\"<>]+(?=@)",                   # URL userinfo
    r"(?P<keep>\b(?i:bearer|basic)\s+)[A-Za-z0-9._~+/=\-]{8,}",                        # Authorization values
    r"(?P<keep>\b(?i:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|password|passwd|secret)"
    r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&}]{4,}",                                          # api_key=..., "password": "..."
    r"\bsk-[A-Za-z0-9_\-*]{12,}",          # OpenAI, Anthropic (sk-ant-...), DeepSeek and most OpenAI-compatible hosts
    r"\bAIza[0-9A-Za-z_\-]{30,}",          # Google
    r"\b(?:hf|gsk|r8|ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}",   # Hugging Face, Groq, Replicate, GitHub
    r"\b(?:xai|pplx)-[A-Za-z0-9]{20,}",    # xAI, Perplexity
    r"\bAKIA[0-9A-Z]{16}\b",               # AWS access key id
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+",   # a JWT
)


def url_credentials(url: str | None) -> list[str]:
    """The secret parts of a URL's userinfo: the password, or the user when there is no password (a token sent as
    the user name, "https://TOKEN@host"). [] for None or a URL without credentials."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:  # not a URL urllib can read (a bad port): the userinfo pattern still covers its text form
        return []
    return [password] if password else [user] if user else []


def secrets_of(deployment: Any, environ: Mapping[str, str]) -> list[str]:
    """The secrets one `link.config.ModelDeployment` reads: its key (see the module docstring) and its URL's
    credentials."""
    found = url_credentials(deployment.api_base)
    if deployment.api_key_env:
        found.append(environ.get(deployment.api_key_env, ""))
    elif deployment.kind == "litellm" and not deployment.api_base:
        found += [value for name, value in environ.items() if name.upper().endswith(PROVIDER_KEY_SUFFIXES)]
    return found


@dataclass(frozen=True)
class Redactor:
    """Replaces secrets in text with REDACTED (see the module docstring).

    Args:
        secrets: literal values to replace wherever they occur; those shorter than MIN_SECRET_CHARS are ignored.
    """

    secrets: tuple[str, ...] = field(default=(), repr=False)  # never in a repr: a traceback or a log may print it
    _pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        literals = sorted({s for s in self.secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        object.__setattr__(self, "secrets", tuple(literals))
        # Literals first, longest first: a key that contains another is replaced whole.
        alternatives = [re.escape(s) for s in literals] + list(TOKEN_PATTERNS)
        renamed = [p.replace("(?P<keep>", f"(?P<keep{i}>") for i, p in enumerate(alternatives)]
        object.__setattr__(self, "_pattern", re.compile("|".join(f"(?:{p})" for p in renamed)))

    @classmethod
    def from_config(cls, settings: Any, config: Any, environ: Mapping[str, str] | None = None) -> Redactor:
        """Every secret the gateway holds: each configured model's key and URL credentials, the master key, the
        credentials of the database and Redis URLs (`settings`: link.settings.Settings; `config`:
        link.config.LinkConfig; `environ` defaults to os.environ)."""
        environ = os.environ if environ is None else environ
        found = [s for d in config.models for s in secrets_of(d, environ)]
        if settings.master_key is not None:
            found.append(settings.master_key.get_secret_value())
        found += url_credentials(settings.database_url) + url_credentials(settings.redis_url)
        return cls(tuple(found))

    @classmethod
    def for_deployments(cls, deployments: Iterable[Any], environ: Mapping[str, str] | None = None) -> Redactor:
        """The secrets of these deployments only (a backend built outside the gateway, e.g. by a test or a script)."""
        environ = os.environ if environ is None else environ
        return cls(tuple(s for d in deployments for s in secrets_of(d, environ)))

    def _replace(self, match: re.Match) -> str:
        keep = next((v for v in match.groupdict().values() if v is not None), "")
        return keep + REDACTED

    def redact(self, text: str | None) -> str | None:
        """`text` with every secret replaced by REDACTED (None stays None)."""
        return self._pattern.sub(self._replace, text) if text else text

    def redact_json(self, value: Any) -> Any:
        """A copy of a JSON value (dicts, lists, strings, numbers) with every string redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_json(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact_json(v) for v in value]
        return value


# Loggers whose records may carry an upstream error or a URL: ours, the server's, and the HTTP and provider
# clients (httpx logs every request's URL, credentials included; LiteLLM logs provider errors and tracebacks).
LOGGED_PACKAGES = ("link", "web", "routers", "serving", "evals", "uvicorn", "httpx", "httpx2", "httpcore", "httpcore2",
                   "openai", "LiteLLM", "litellm")


class RedactingFilter(logging.Filter):
    """Rewrites a log record's message and traceback text with `redactor` (the record is still logged)."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if record.args:  # keep the arguments' shape: a formatter may read them (uvicorn's access log unpacks five)
                record.msg = self.redactor.redact(record.msg) if isinstance(record.msg, str) else record.msg
                record.args = (self._redacted_args(record.args) if isinstance(record.args, tuple)
                               else {k: self._redacted_arg(v) for k, v in record.args.items()})
            else:
                record.msg = self.redactor.redact(record.getMessage())
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)  # what handlers would print
            record.exc_text = self.redactor.redact(record.exc_text)
            record.stack_info = self.redactor.redact(record.stack_info)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is the handler's to report, as before
            pass
        return True


    def _redacted_arg(self, value: Any) -> Any:
        """A %-argument with its secrets redacted: numbers stay numbers (for %d), anything else becomes its
        redacted text (a URL object or an exception prints its credentials as text)."""
        return value if isinstance(value, (int, float)) or value is None else self.redactor.redact(str(value))

    def _redacted_args(self, args: tuple) -> tuple:
        return tuple(self._redacted_arg(value) for value in args)


def _loggers(packages: Iterable[str]) -> list[logging.Logger]:
    # A logger's filters see only the records logged through it, not its children's: every existing logger of
    # each package gets the filter (modules create theirs at import, before the lifespan runs).
    names = set(packages) | {n for n in list(logging.root.manager.loggerDict)
                             if any(n.startswith(p + ".") for p in packages)}
    return [logging.getLogger(n) for n in sorted(names)]


def attach_log_filter(redactor: Redactor, packages: Iterable[str] = LOGGED_PACKAGES) -> RedactingFilter:
    """Add a `RedactingFilter` to every logger of `packages`; returns it for `detach_log_filter`."""
    log_filter = RedactingFilter(redactor)
    for logger in _loggers(packages):
        logger.addFilter(log_filter)
    return log_filter


def detach_log_filter(log_filter: RedactingFilter, packages: Iterable[str] = LOGGED_PACKAGES) -> None:
    """Remove a filter `attach_log_filter` added (at shutdown)."""
    for logger in _loggers(packages):
        logger.removeFilter(log_filter)
