"""Strict checks of a policy's name and options, shared by every policy type (link/policies/*.py).

    check_options("moa", options, allowed=("aggregator", "layers", ...))   # unknown keys, NaN/Infinity anywhere
    layers = int_option(options, "layers", 1, low=1, high=4)              # an integer in [1, 4], else PolicyError
    deadline_s = number_option(options, "deadline_s", 60.0, low=0, high=3600, low_open=True)

Each error is a `PolicyError` whose `param` names the field ("options.layers", "options.moa.deadline_s",
"options.proposers[0].temperature"), which the API returns (400) and the console shows beside the field.
Numbers must be JSON numbers (not strings, not booleans), finite and inside a documented range: a stored
option is served on `/v1/models` cards, where NaN, Infinity or an absurd value must never reach the JSON.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any


class PolicyError(ValueError):
    """An invalid policy definition. `param` names the offending field ("models", "type", "options.layers")."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


def check_name(name: str) -> None:
    """A policy name: no control characters (newline, tab...) and no leading or trailing whitespace.
    Raises PolicyError (param "name")."""
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise PolicyError(f"a policy name cannot hold control characters (newline, tab...), got {name!r}", param="name")
    if name != name.strip():
        raise PolicyError(f"a policy name cannot start or end with whitespace, got {name!r}", param="name")


def check_finite(value: Any, param: str) -> None:
    """Every number inside `value` (nested lists and dicts) is finite. Raises PolicyError naming its path."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PolicyError(f"{param} must be a finite number, got {value!r}", param=param)
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, f"{param}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_finite(item, f"{param}[{i}]")


def check_options(policy_type: str, options: dict[str, Any], allowed: tuple[str, ...] | None,
                  prefix: str = "options") -> None:
    """Options are a JSON object of finite values whose keys the type knows (`allowed`; None: any key).
    Raises PolicyError naming the first unknown key ("options.colour") and listing the allowed ones."""
    if not isinstance(options, dict):
        raise PolicyError(f"{prefix} must be a JSON object, got {type(options).__name__}", param=prefix)
    if allowed is not None:
        unknown = [k for k in options if k not in allowed]
        if unknown:
            known = ", ".join(allowed) if allowed else "none besides the common ones"
            raise PolicyError(f"unknown option {unknown[0]!r} of a {policy_type!r} policy; its options: {known}",
                              param=f"{prefix}.{unknown[0]}")
    check_finite(options, prefix)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_value(value: Any, param: str, low: float, high: float, *, low_open: bool = False) -> float:
    """`value` as a float in [low, high] ((low, high] with `low_open`). Raises PolicyError naming `param`."""
    bracket = "(" if low_open else "["
    if not _is_number(value) or not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise PolicyError(f"{param} must be a number in {bracket}{low:g}, {high:g}], got {value!r}", param=param)
    return float(value)


def number_option(options: dict[str, Any], key: str, default: float | None, low: float, high: float, *,
                  low_open: bool = False, prefix: str = "options") -> float | None:
    """options[key] as a float in [low, high], or `default` when absent. Raises PolicyError."""
    if key not in options:
        return default
    return number_value(options[key], f"{prefix}.{key}", low, high, low_open=low_open)


def int_option(options: dict[str, Any], key: str, default: int | None, low: int, high: int, *,
               nullable: bool = False, prefix: str = "options") -> int | None:
    """options[key] as an integer in [low, high] (null allowed with `nullable`), or `default` when absent.
    Raises PolicyError."""
    if key not in options or (nullable and options[key] is None):
        return default if key not in options else None
    value = options[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PolicyError(f"{prefix}.{key} must be a whole number in [{low}, {high}], got {value!r}",
                          param=f"{prefix}.{key}")
    return value


def bool_option(options: dict[str, Any], key: str, default: bool, prefix: str = "options") -> bool:
    """options[key] as true or false, or `default` when absent. Raises PolicyError."""
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(f"{prefix}.{key} must be true or false, got {value!r}", param=f"{prefix}.{key}")
    return value


def str_option(options: dict[str, Any], key: str, default: str | None, prefix: str = "options") -> str | None:
    """options[key] as a non-empty string, or `default` when absent. Raises PolicyError."""
    if key not in options:
        return default
    value = options[key]
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{prefix}.{key} must be a non-empty string, got {value!r}", param=f"{prefix}.{key}")
    return value
