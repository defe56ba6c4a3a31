"""web/formatting.py: how the console writes amounts of USD and JSON (web/static/format.js follows the same rule;
test_browser.py::test_browser_formats_costs_like_the_server compares the two)."""

from __future__ import annotations

import pytest

from web.formatting import compact_json, format_usd, format_usd_input, pretty_json


@pytest.mark.parametrize("value,text", [
    (0, "$0"), (0.0, "$0"), (1e-6, "$0.000001"), (9.5e-06, "$0.0000095"), (5e-05, "$0.00005"), (0.013, "$0.013"),
    (0.123456, "$0.1235"), (0.00012345, "$0.0001234"), (0.99996, "$1.00"), (1, "$1.00"), (12.345, "$12.35"),
    (1234.5, "$1,234.50"), (-0.5, "-$0.5"), (1.2345e-10, "$1.234e-10"), (None, "–"), (float("nan"), "–"),
    (float("inf"), "–")])
def test_format_usd(value, text):
    assert format_usd(value) == text


# Hand-checked against the rule (four significant digits below a dollar, cents from a dollar up). 0.000012345 is
# stored as 1.2344999...e-05 (the nearest double), so its fourth significant digit rounds down: $0.00001234.
@pytest.mark.parametrize("value,text", [
    (0.00001, "$0.00001"), (0.000012345, "$0.00001234"), (0.5, "$0.5"), (1234.5, "$1,234.50"), (0, "$0")])
def test_format_usd_below_a_cent_keeps_four_significant_digits(value, text):
    assert format_usd(value) == text


@pytest.mark.parametrize("value,text", [
    (0.00001, "0.00001"), (0.000012345, "0.000012345"), (0.5, "0.5"), (1234.5, "1234.5"), (0, "0"), (5.0, "5"),
    (0.1, "0.1"), (1e-07, "0.0000001"), (1e20, "100000000000000000000"), (None, "")])
def test_an_editable_usd_field_holds_the_exact_value(value, text):
    assert format_usd_input(value) == text
    if value is not None:
        assert float(text) == value  # saving the field unchanged writes back the same number


def test_an_editable_usd_field_refuses_nan_and_infinity():
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            format_usd_input(value)


def test_json_for_display_is_text():
    assert pretty_json({"a": [1, "<script>"]}) == '{\n  "a": [\n    1,\n    "<script>"\n  ]\n}'  # escaped by the template
    assert compact_json({"capture_traces": True, "é": 1}) == '{"capture_traces": true, "é": 1}'
