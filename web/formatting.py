"""How TogetherLink writes money and JSON for people: the one USD rule of the console (Jinja2 filters `usd`,
`usd_input`, `pretty_json`, and `caller`: who sent a logged request), `link keys list`, `link route` and `link eval`
reports (report.md, the replay table); web/static/format.js is the same rule for the browser's charts and "try it".

    format_usd(0.013)         -> "$0.013"
    format_usd(9.5e-06)       -> "$0.0000095"
    format_usd(1234.5)        -> "$1,234.50"
    format_usd_input(1e-05)   -> "0.00001"   (an editable field: the exact stored value, never a rounded one)
    pretty_json({"a": 1})     -> '{\n  "a": 1\n}'   (autoescaped by the template like any text)
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

SIGNIFICANT_DIGITS = 4  # of amounts under one dollar (a request costs micro-dollars)


def format_usd(value: float | None, *, symbol: str = "$") -> str:
    """USD for people: two decimals from one dollar up; below, four significant digits in fixed point, trailing
    zeros dropped; under a nano-dollar (below the ledger's resolution), scientific. None or NaN: "–".
    `symbol` goes before the digits: "" where a column header already says USD (report.md, where a "$" could
    start a LaTeX span in some Markdown renderers)."""
    if value is None or not math.isfinite(value):
        return "–"
    if value == 0:
        return f"{symbol}0"
    sign, amount = ("-" if value < 0 else ""), abs(value)
    if amount >= 1 - 0.5 * 10 ** -SIGNIFICANT_DIGITS:  # 0.99996 would round to "1.000": written as a dollar amount
        return f"{sign}{symbol}{amount:,.2f}"
    if amount >= 1e-9:
        decimals = SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(amount))
        return sign + symbol + f"{amount:.{decimals}f}".rstrip("0").rstrip(".")
    return f"{sign}{symbol}{amount:.{SIGNIFICANT_DIGITS - 1}e}"


def format_usd_input(value: float | None) -> str:
    """The value of an editable USD field: the exact float in plain decimals (no "$", no grouping, no exponent),
    so that saving the form unchanged writes back the same number. None: "" (the field's "unlimited").

    Its text is Python's shortest round-trip `repr` written out in fixed point: 1e-05 -> "0.00001",
    5.0 -> "5", 0.1 -> "0.1", 1e+20 -> "100000000000000000000". Raises ValueError for NaN or infinity (no field
    may hold them).
    """
    if value is None:
        return ""
    if not math.isfinite(value):
        raise ValueError(f"a USD field must hold a finite number, got {value!r}")
    text = format(Decimal(repr(float(value))), "f")
    return text[:-2] if text.endswith(".0") else text


def caller_label(row: dict[str, Any]) -> str:
    """Who sent a logged request (a /api/requests row), for the request log: its key's id ("7"), "deleted key"
    (a key row deleted since), "master", "open (anonymous)" for open mode, "none (refused)" for a 401 (no key was
    accepted), else "–" (a row logged before callers were recorded, or one that failed before its key was checked).
    """
    if row.get("api_key_id") is not None:
        return str(row["api_key_id"])
    caller = row.get("caller")
    if caller == "key":
        return "deleted key"
    if caller == "master":
        return "master"
    if caller == "open":
        return "open (anonymous)"
    return "none (refused)" if row.get("http_status") == 401 else "–"


def pretty_json(value: Any) -> str:
    """`value` as indented JSON text, for display (the template escapes it; `tojson` is only for <script> data)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def compact_json(value: Any) -> str:
    """`value` as one line of JSON text, for table cells."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
