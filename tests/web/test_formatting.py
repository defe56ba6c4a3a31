"""web/formatting.py: how the console writes amounts of USD and JSON (web/static/format.js follows the same rule;
test_browser.py::test_browser_formats_costs_like_the_server compares the two)."""

from __future__ import annotations

import pytest

from web.formatting import compact_json, format_usd, pretty_json


@pytest.mark.parametrize("value,text", [
    (0, "$0"), (0.0, "$0"), (1e-6, "$0.000001"), (9.5e-06, "$0.0000095"), (5e-05, "$0.00005"), (0.013, "$0.013"),
    (0.123456, "$0.1235"), (0.00012345, "$0.0001234"), (0.99996, "$1.00"), (1, "$1.00"), (12.345, "$12.35"),
    (1234.5, "$1,234.50"), (-0.5, "-$0.5"), (1.2345e-10, "$1.234e-10"), (None, "–"), (float("nan"), "–"),
    (float("inf"), "–")])
def test_format_usd(value, text):
    assert format_usd(value) == text


def test_json_for_display_is_text():
    assert pretty_json({"a": [1, "<script>"]}) == '{\n  "a": [\n    1,\n    "<script>"\n  ]\n}'  # escaped by the template
    assert compact_json({"capture_traces": True, "é": 1}) == '{"capture_traces": true, "é": 1}'
