"""How the console writes numbers and JSON (Jinja2 filters `usd` and `pretty_json`; web/static/format.js is the
same rule for the browser's charts and "try it").

    format_usd(0.013)       -> "$0.013"
    format_usd(9.5e-06)     -> "$0.0000095"
    format_usd(1234.5)      -> "$1,234.50"
    pretty_json({"a": 1})   -> '{\n  "a": 1\n}'   (autoescaped by the template like any text)
"""

from __future__ import annotations

import json
import math
from typing import Any

SIGNIFICANT_DIGITS = 4  # of amounts under one dollar (a request costs micro-dollars)


def format_usd(value: float | None) -> str:
    """USD for people: two decimals from one dollar up; below, four significant digits in fixed point, trailing
    zeros dropped; under a nano-dollar (below the ledger's resolution), scientific. None or NaN: "–"."""
    if value is None or not math.isfinite(value):
        return "–"
    if value == 0:
        return "$0"
    sign, amount = ("-" if value < 0 else ""), abs(value)
    if amount >= 1 - 0.5 * 10 ** -SIGNIFICANT_DIGITS:  # 0.99996 would round to "1.000": written as a dollar amount
        return f"{sign}${amount:,.2f}"
    if amount >= 1e-9:
        decimals = SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(amount))
        return f"{sign}${amount:.{decimals}f}".rstrip("0").rstrip(".")
    return f"{sign}${amount:.{SIGNIFICANT_DIGITS - 1}e}"


def pretty_json(value: Any) -> str:
    """`value` as indented JSON text, for display (the template escapes it; `tojson` is only for <script> data)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def compact_json(value: Any) -> str:
    """`value` as one line of JSON text, for table cells."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
