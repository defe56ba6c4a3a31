"""The console's "try it" in real Chromium on a Mixture-of-Agents: the answer's own usage and what the request is
billed for over every call (the gateway's `usage.link_billed`), beside its cost. Fixtures: tests/web/conftest.py."""

from __future__ import annotations

import pytest

from tests.web.conftest import MOCK_PRICES, browser_login
from web.formatting import format_usd

pytestmark = pytest.mark.browser


def test_try_it_shows_a_moas_own_usage_and_what_it_is_billed(page):
    """The Mixture-of-Agents `mixture` (m1 and m2 propose, m2 aggregates; the mock counts a token per word): the answer's
    usage is the aggregator's call, the billed tokens every call's, the cost the request's (its log row)."""
    from routers.moa import SYNTHESIS_PROMPT

    browser_login(page)
    page.goto("/console/policies/try?policy=mixture")
    page.fill("#try-prompt", "hello there")
    page.click("#try-run")
    page.wait_for_function("document.getElementById('try-status').textContent.startsWith('Done')", timeout=60_000)
    assert page.locator("#try-answer").inner_text() == "You said: hello there"
    instruction = len((SYNTHESIS_PROMPT + "".join(f"\n\nAnswer {i}:\nYou said: hello there" for i in (1, 2))).split())
    aggregator_prompt, prompt = instruction + 2, 2 + 2 + instruction + 2
    cost = (prompt * MOCK_PRICES["input_cost_per_million"] + 12 * MOCK_PRICES["output_cost_per_million"]) / 1e6
    assert page.locator("#try-usage").inner_text().startswith(
        f"{aggregator_prompt} prompt + 4 completion tokens (billed over 3 calls: {prompt} + 12) · {format_usd(cost)} · ")
