"""The console's new-policy form: the type is a <select> of every registered policy type, the options
placeholder is JSON the default type accepts, and the hint under the options names each type's option keys."""

from __future__ import annotations

import html
import json
import re

import httpx

from link.policies.base import POLICIES
from tests.link.gateway_launch import MASTER_KEY

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


def _select(page: str) -> list[tuple[str, bool]]:
    """The type <select>'s options as (value, selected)."""
    body = re.search(r'<select id="type" name="type"[^>]*>(.*?)</select>', page, re.S)
    assert body, "the form has no type <select>"
    return [(value, bool(selected)) for value, selected in
            re.findall(r'<option value="([^"]*)"\s*(selected)?', body.group(1))]


def test_the_type_is_a_select_of_every_registered_type(admin):
    page = admin.get("/console/policies/new").text
    options = _select(page)
    assert [value for value, _ in options] == sorted(POLICIES)
    assert {"fixed", "fallback", "router", "cascade", "moa", "hybrid"} <= set(POLICIES)
    assert [value for value, selected in options if selected] == ["fallback"]  # the form's default type
    assert 'id="type" name="type" value=' not in page and "<datalist" not in page  # no free text


def test_the_options_placeholder_is_accepted_for_the_default_type(admin, console_gateway):
    page = admin.get("/console/policies/new").text
    quoted = re.search(r"""<textarea id="options"[^>]*placeholder=(?:"([^"]*)"|'([^']*)')""", page)
    placeholder = html.unescape(quoted.group(1) if quoted.group(1) is not None else quoted.group(2))
    options = json.loads(placeholder)
    default = re.search(r'<option value="([^"]*)" selected|id="type" name="type" value="([^"]*)"', page)
    default = default.group(1) or default.group(2)  # the select's choice (before it, the free text's value)
    created = httpx.post(console_gateway.url + "/api/policies", headers=AUTH,
                         json={"name": "placeholder-check", "type": default, "models": ["m1", "m2"], "options": options})
    try:
        assert created.status_code in (200, 201), created.text
        assert created.json()["options"] == options
    finally:
        httpx.delete(console_gateway.url + "/api/policies/placeholder-check", headers=AUTH)


def test_the_hint_names_the_option_keys_of_each_type(admin):
    page = admin.get("/console/policies/new").text
    hints = json.loads(re.search(r'<script type="application/json" id="option-hints">(.*?)</script>', page, re.S).group(1))
    assert set(hints) == set(POLICIES)
    # fixed and fallback take only the common options; moa's first own keys, from link/policies/moa.py, and the
    # common options but continue_on_failure (its answer comes from several calls)
    assert hints["fixed"] == hints["fallback"] == "capture_traces, continue_on_failure, cache"
    assert hints["moa"].startswith("aggregator, temperatures, proposers") and hints["moa"].endswith(", capture_traces, cache")
    shown = re.search(r'<span id="options-keys">([^<]*)</span>', page).group(1)
    assert shown == "capture_traces, continue_on_failure, cache"  # the default type's, before any script runs
