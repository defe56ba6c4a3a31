"""The `cache` option every policy type takes: how the gateway's response cache (link/response_cache.py) serves it.

    - name: cached-chat
      type: fixed
      models: [gpt-4o-mini]
      options:
        cache:
          mode: exact            # exact | semantic (required)
          ttl_s: 300             # seconds an answer is served, in (0, 2592000]; default 300
          similarity: 0.97       # semantic only: the least cosine similarity of a hit, in [0.5, 1]; default 0.97
          shared: false          # true: one cache for every key; default false (one per key)
          max_entries: 1000      # answers kept in process memory (LRU), in [1, 1000000]; default 1000
          max_bytes: 67108864    # their total size in bytes, in [1024, 2^34]; default 64 MiB (one answer at most
                                 # a quarter of it; Redis keeps answers under the TTL alone)

    options = cache_options(policy.config.options)     # None when the policy does not cache; else CacheOptions
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from link.policies.options import PolicyError, bool_option, check_options, int_option, number_option

MODES = ("exact", "semantic")
KEYS = ("mode", "ttl_s", "similarity", "shared", "max_entries", "max_bytes")
MAX_TTL_S = 30 * 86400


@dataclass(frozen=True)
class CacheOptions:
    """A policy's response-cache settings (module docstring); `ttl_s` in seconds, `max_bytes` in bytes."""

    mode: str
    ttl_s: float = 300.0
    similarity: float = 0.97
    is_shared: bool = False
    max_entries: int = 1000
    max_bytes: int = 64 * 1024 * 1024

    @property
    def is_semantic(self) -> bool:
        return self.mode == "semantic"


def cache_options(options: dict[str, Any]) -> CacheOptions | None:
    """The policy's `cache` option read strictly, or None when absent (or null).

    Raises:
        PolicyError: not an object, an unknown key, a mode other than exact|semantic, a value out of its range
            (param "options.cache.<key>").
    """
    raw = options.get("cache") if isinstance(options, dict) else None
    if raw is None:
        return None
    prefix = "options.cache"
    check_options("cache", raw, KEYS, prefix=prefix)
    mode = raw.get("mode")
    if mode not in MODES:
        raise PolicyError(f"{prefix}.mode must be one of {MODES}, got {mode!r}", param=f"{prefix}.mode")
    return CacheOptions(
        mode=mode,
        ttl_s=number_option(raw, "ttl_s", 300.0, 0.0, MAX_TTL_S, low_open=True, prefix=prefix),
        similarity=number_option(raw, "similarity", 0.97, 0.5, 1.0, prefix=prefix),
        is_shared=bool_option(raw, "shared", False, prefix=prefix),
        max_entries=int_option(raw, "max_entries", 1000, 1, 1_000_000, prefix=prefix),
        max_bytes=int_option(raw, "max_bytes", 64 * 1024 * 1024, 1024, 2**34, prefix=prefix))
