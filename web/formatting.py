"""How the console writes money and JSON for people (Jinja2 filters `usd`, `usd_input`, `pretty_json`, and
`caller`: who sent a logged request). The USD rule itself is `link/money.py`, shared with `link keys list`,
`link route` and `link eval` reports; web/static/format.js is the same rule for the browser's charts and "try it".

    format_usd(0.013)         -> "$0.013"
    format_usd(9.5e-06)       -> "$0.0000095"
    format_usd(1234.5)        -> "$1,234.50"
    format_usd_input(1e-05)   -> "0.00001"   (an editable field: the exact stored value, never a rounded one)
    pretty_json({"a": 1})     -> '{\n  "a": 1\n}'   (autoescaped by the template like any text)
"""

from __future__ import annotations

import json
from typing import Any

from link.money import SIGNIFICANT_DIGITS, format_usd, format_usd_input

__all__ = ["SIGNIFICANT_DIGITS", "caller_label", "compact_json", "format_usd", "format_usd_input", "pretty_json"]


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
