"""The one rule for writing USD amounts for people, shared by the CLI (`link keys list`, `link route`), the
`link eval` reports and the console (web/formatting.py; web/static/format.js is the same rule in the browser).

    format_usd(0.013)         -> "$0.013"
    format_usd(9.5e-06)       -> "$0.0000095"
    format_usd(1234.5)        -> "$1,234.50"
    format_usd_input(1e-05)   -> "0.00001"   (an editable field: the exact stored value, never a rounded one)
"""

from __future__ import annotations

import math
from decimal import Decimal

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
