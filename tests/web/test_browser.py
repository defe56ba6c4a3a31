"""The console in real Chromium against a gateway on loopback: log in, policies (create, edit, a validation
error, delete), "try it" with the local SmolLM2, Traffic totals for 20 requests, an eval report's plot, keys,
models, the Traffic filters, no page wider than the window. Each test saves screenshots (1280x800) with the
`screenshot` fixture (tests/web/conftest.py: $LINK_SCREENSHOT_DIR, else pytest's temporary folder)."""

from __future__ import annotations

import math
import struct
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import LOCAL_MODEL, MOCK_PRICES, browser_login
from web.formatting import format_usd

pytestmark = pytest.mark.browser
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


def api(gateway, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, gateway.url + path, headers=AUTH, timeout=60, **kwargs)


def test_login_redirect_and_logout(page, screenshot):
    page.goto("/console/policies")
    assert "/console/login?next=/console/policies" in page.url
    screenshot(page, "01-login")
    page.fill("#key", "wrong-key-0123456789")
    page.click("button[type=submit]")
    assert page.locator(".field-error").inner_text() == "That is not the master key."
    page.fill("#key", MASTER_KEY)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/policies")
    page.click("text=Log out")
    page.wait_for_url("**/console/login")
    page.goto("/console/keys")
    assert "/console/login" in page.url


def test_policy_create_edit_invalid_delete(page, console_gateway, screenshot):
    browser_login(page)
    page.click("nav >> text=Policies")
    page.click("text=New policy")
    page.fill("#name", "browser-policy")
    assert page.input_value("#type") == "fallback"  # the default choice; its option keys are named
    assert page.locator("#options-keys").inner_text() == "capture_traces, continue_on_failure, cache"
    page.select_option("#type", "moa")  # the hint follows the type chosen
    assert page.locator("#options-keys").inner_text().startswith("aggregator, ")
    page.select_option("#type", "fallback")
    page.fill("#models", "m1, m2")
    page.fill("#options", '{"capture_traces": true}')
    page.click("button:has-text('Create')")
    page.wait_for_url("**/console/policies")
    row = page.locator("tr[data-policy='browser-policy']")
    assert row.locator("td").nth(2).inner_text() == "m1, m2"
    assert api(console_gateway, "GET", "/api/policies/browser-policy").json()["options"] == {"capture_traces": True}
    assert page.locator("tr[data-policy='browser-policy'] td code").inner_text() == '{"capture_traces": true}'

    row.locator("text=Edit").click()
    assert page.input_value("#models") == "m1, m2"
    page.fill("#models", "m2, m1")
    page.click("button:has-text('Save')")
    page.wait_for_url("**/console/policies")
    assert page.locator("tr[data-policy='browser-policy'] td").nth(2).inner_text() == "m2, m1"

    page.locator("tr[data-policy='browser-policy']").locator("text=Edit").click()
    page.select_option("#type", "fixed")  # a fixed policy takes exactly one model: the API names `models`
    page.click("button:has-text('Save')")
    error = page.locator("#models-error")
    assert error.is_visible() and "model" in error.inner_text()
    assert page.locator(".field.invalid #models").count() == 1
    assert page.input_value("#type") == "fixed"  # what was chosen is kept
    screenshot(page, "03-policy-form-error")
    page.fill("#options", "{not json")
    page.click("button:has-text('Save')")
    assert "options must be JSON" in page.locator("#options-error").inner_text()
    page.select_option("#type", "fallback")
    page.fill("#options", '{"colour": 1}')  # an option the type does not have: named, with the allowed ones
    page.click("button:has-text('Save')")
    assert page.locator("#options-error").inner_text() == ("unknown option 'colour' of a 'fallback' policy; "
                                                          "its options: capture_traces, continue_on_failure, cache")
    page.fill("#options", '{"capture_traces": NaN}')  # json.loads would read it; JSON has no NaN
    page.click("button:has-text('Save')")
    assert "NaN is not a JSON number" in page.locator("#options-error").inner_text()
    page.fill("#options", "")
    page.fill("#name", "tab\tname")
    page.click("button:has-text('Save')")
    assert "control characters" in page.locator("#name-error").inner_text()
    assert api(console_gateway, "GET", "/api/policies/browser-policy").json()["models"] == ["m2", "m1"]

    page.goto("/console/policies")
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "02-policies")
    page.locator("tr[data-policy='browser-policy']").locator("button:has-text('Delete')").click()
    page.wait_for_load_state()
    assert page.locator("tr[data-policy='browser-policy']").count() == 0
    assert api(console_gateway, "GET", "/api/policies/browser-policy").status_code == 404


def test_try_it_with_the_local_model(page, console_gateway, screenshot):
    browser_login(page)
    page.goto(f"/console/policies/try?policy={LOCAL_MODEL}")
    page.fill("#try-prompt", "What is the capital of France?")
    page.fill("#try-max-tokens", "8")
    assert page.input_value("#try-temperature") == "0"  # deterministic by default
    answers = []
    for _ in range(2):  # temperature 0: greedy, the same answer twice
        page.click("#try-run")
        page.wait_for_function("document.getElementById('try-status').textContent.startsWith('Done')", timeout=240_000)
        answers.append(page.locator("#try-answer").inner_text())
    assert answers[0].strip() and answers[0] == answers[1]
    assert page.locator("#try-chosen").inner_text() == LOCAL_MODEL
    assert page.locator("#try-scores").is_hidden()  # a fixed policy predicts nothing: said in words, not dashes
    assert page.locator("#try-note").inner_text() == ("fixed policy: no prediction; it always sends the request to "
                                                      "its one model.")
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "04-try-it")
    request_id = page.locator("#try-status").inner_text().split("request ")[1].rstrip(").")
    console_gateway.flush_log()
    row = api(console_gateway, "GET", f"/api/requests/{request_id}").json()
    assert row["model"] == LOCAL_MODEL and row["stream"] is True and 1 <= row["completion_tokens"] <= 8
    usage = page.locator("#try-usage").inner_text()  # the latency is rounded by the page: not compared exactly
    assert usage.startswith(f"{row['prompt_tokens']} prompt + {row['completion_tokens']} completion tokens · "
                            f"{format_usd(row['cost_usd'])} · ") and usage.endswith(" ms")
    assert row["decision"]["type"] == "fixed"


def test_try_it_shows_the_routers_decision(page, screenshot):
    """The test router's table (router_fakes): for a "math" prompt small 0.2, big 0.9; expected costs 0.001 and
    0.01 USD; at lambda 20, big's objective 0.9 - 0.2 beats small's 0.2 - 0.02."""
    browser_login(page)
    page.goto("/console/policies/try?policy=routed")
    page.fill("#try-prompt", "a math question")
    page.click("#try-run")
    page.wait_for_function("document.getElementById('try-status').textContent.startsWith('Done')")
    rows = [[c.inner_text() for c in r.locator("td").all()] for r in page.locator("#try-scores tbody tr").all()]
    assert rows == [["small", "0.2000", "$0.001", ""], ["big", "0.9000", "$0.01", "chosen"]]
    assert page.locator("#try-note").is_hidden()
    assert page.locator("#try-chosen").inner_text() == "big"
    assert page.locator("#try-answer").inner_text() == "You said: a math question"
    # the mock counts one token per word: 3 prompt + 5 completion tokens at the mock prices
    assert page.locator("#try-usage").inner_text().startswith("3 prompt + 5 completion tokens · $0.013 · ")
    screenshot(page, "04b-try-it-router")


def test_try_it_shows_a_script_prompt_as_text(page):
    browser_login(page)
    page.goto("/console/policies/try?policy=from-config")
    evil = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"
    page.fill("#try-prompt", evil)
    page.click("#try-run")
    page.wait_for_function("document.getElementById('try-status').textContent.startsWith('Done')")
    # the mock answers "You said: " + the prompt, one word per token
    assert page.locator("#try-answer").inner_text() == "You said: " + evil
    assert page.locator("#try-answer script, #try-answer img").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.locator("#try-chosen").inner_text() == "m1"
    assert page.locator("#try-note").inner_text() == ("fallback policy: no prediction; its models are tried in order, "
                                                      "the next only when one fails before answering.")


def test_traffic_shows_twenty_requests_with_their_totals(page, console_gateway, screenshot):
    key = api(console_gateway, "POST", "/api/keys", json={"name": "traffic-browser"}).json()
    before = datetime.now(timezone.utc)
    usages = []
    with httpx.Client(base_url=console_gateway.base_url, headers={"Authorization": f"Bearer {key['key']}"}) as client:
        for i in range(20):
            model = ("m1", "m2", "from-config")[i % 3]
            body = {"model": model, "messages": [{"role": "user", "content": " ".join(["word"] * (i + 1))}],
                    "max_tokens": 5 + i}
            response = client.post("/chat/completions", json=body)
            assert response.status_code == 200, response.text
            usages.append((response.headers["x-link-model"], response.headers["x-link-policy"], response.json()["usage"]))
    console_gateway.flush_log()
    prompt = sum(u["prompt_tokens"] for _, _, u in usages)
    completion = sum(u["completion_tokens"] for _, _, u in usages)
    cost = math.fsum(u["prompt_tokens"] * MOCK_PRICES["input_cost_per_million"] / 1e6
                     + u["completion_tokens"] * MOCK_PRICES["output_cost_per_million"] / 1e6 for _, _, u in usages)

    browser_login(page)
    page.goto(f"/console/traffic?range=15m&key={key['id']}")
    total = lambda name: page.locator(f"[data-total={name}]").inner_text()  # noqa: E731
    assert total("requests") == "20"
    assert total("prompt_tokens") == f"{prompt:,}"
    assert total("completion_tokens") == f"{completion:,}"
    assert total("cost_usd") == format_usd(cost)
    assert total("errors") == "0"
    shares = {r.locator("td").nth(0).inner_text(): int(r.locator("td").nth(1).inner_text())
              for r in page.locator("#share-model tbody tr").all()}
    assert shares == {m: sum(1 for model, _, _ in usages if model == m) for m in ("m1", "m2")}
    policies = {r.locator("td").nth(0).inner_text(): int(r.locator("td").nth(1).inner_text())
                for r in page.locator("#share-policy tbody tr").all()}
    assert policies == {"m1": 7, "m2": 7, "from-config": 6}
    assert page.locator("#request-log tbody tr").count() == 20
    newest = usages[-1][2]
    assert (page.locator("#request-log tbody tr").first.locator("td").nth(4).inner_text()
            == f"{newest['prompt_tokens']} + {newest['completion_tokens']}")
    assert page.locator("canvas#chart-requests").bounding_box()["height"] > 100
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "05-traffic")

    minute = "%Y-%m-%dT%H:%M"  # a custom range (the form's datetime-local fields, UTC)
    after = datetime.now(timezone.utc) + timedelta(minutes=1)
    page.goto(f"/console/traffic?key={key['id']}&since={before - timedelta(minutes=1):{minute}}&until={after:{minute}}")
    assert total("requests") == "20" and total("prompt_tokens") == f"{prompt:,}"
    page.goto(f"/console/traffic?key={key['id']}&since={before - timedelta(minutes=9):{minute}}"
              f"&until={before - timedelta(minutes=2):{minute}}")
    assert total("requests") == "0" and total("cost_usd") == "$0"
    page.goto(f"/console/traffic?range=15m&key={key['id']}")

    page.locator("#request-log tbody tr a").first.click()  # the newest request
    page.wait_for_url("**/console/requests/**")
    last = usages[-1][2]
    facts = page.locator("dl.facts").all_inner_texts()
    assert f"prompt tokens\n{last['prompt_tokens']}" in "\n".join(facts)
    assert f"completion tokens\n{last['completion_tokens']}" in "\n".join(facts)
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "06-request")


def test_request_page_shows_the_moa_proposers_escaped(page, console_gateway, screenshot):
    evil = "<script>window.pwned = 1</script>"
    response = api(console_gateway, "POST", "/v1/chat/completions",
                   json={"model": "mixture", "messages": [{"role": "user", "content": evil}]})
    assert response.status_code == 200, response.text
    request_id = response.headers["x-link-request-id"]
    console_gateway.flush_log()
    row = api(console_gateway, "GET", f"/api/requests/{request_id}").json()
    browser_login(page)
    page.goto(f"/console/requests/{request_id}")
    proposers = [[c.inner_text() for c in r.locator("td").all()] for r in page.locator("#proposers tbody tr").all()]
    calls = row["decision"]["moa"]["proposals"]
    assert [p[1] for p in proposers] == [c["model"] for c in calls] and sorted(p[1] for p in proposers) == ["m1", "m2"]
    assert all(p[6] == "You said: " + evil for p in proposers)  # the mock echoes the prompt: shown as text
    assert [p[5] for p in proposers] == [f"{c['prompt_tokens']} + {c['completion_tokens']}" for c in calls]
    assert page.evaluate("window.pwned") is None
    assert "aggregator: m2" in page.locator("#proposers-aggregator").inner_text()
    facts = "\n".join(page.locator("dl.facts").all_inner_texts())
    assert f"prompt tokens\n{row['prompt_tokens']}" in facts and f"cost\n{format_usd(row['cost_usd'])}" in facts
    calls = [[c.inner_text() for c in r.locator("td").all()] for r in page.locator("#calls tbody tr").all()]
    assert [c[0] for c in calls] == [c["model"] for c in row["decision"]["calls"]]
    assert sum(int(c[2]) for c in calls) == row["prompt_tokens"]  # every call is billed to the request
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "06b-request-moa")


def _png_size(data: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return width, height


def test_eval_report_plot_and_compare(page, console_gateway, tmp_path, screenshot):
    from evals.cache import EvalStore
    from evals.plot import quality_cost_figure, save_png

    png = save_png(quality_cost_figure(["m1", "m2"], [0.4, 1.2], [0.55, 0.7], ci=[(0.5, 0.6), (0.64, 0.76)],
                                       title="gsm8k"), tmp_path / "plot.png").read_bytes()
    summaries = [{"name": n, "suite": "gsm8k", "n": 50, "score": s, "ci_low": s - 0.05, "ci_high": s + 0.05,
                  "cost_usd": c / 20, "cost_per_1k_usd": c, "latency_p50_s": 0.4, "latency_p95_s": 0.9,
                  "prompt_tokens": 1000, "completion_tokens": 500} for n, s, c in (("m1", 0.55, 0.4), ("m2", 0.7, 1.2))]
    store = EvalStore(console_gateway.state.settings.database_url)
    try:
        for run_id, score in (("run-a", 0.55), ("run-b", 0.7)):
            store.save_run({"id": run_id, "suite": "gsm8k", "split": "test", "targets": ["m1"], "status": "finished",
                            "finished_at": datetime.now(timezone.utc),
                            "totals": {"m1": {"n": 50, "errors": 0, "score": score, "cost_usd": 0.02,
                                              "latency_p50_s": 0.4, "latency_p95_s": 0.9}}})
        # a run that recorded only some totals (stopped early) still lists
        store.save_run({"id": "run-partial", "suite": "mmlu", "targets": ["m1"], "status": "stopped",
                        "totals": {"m1": {"n": 1}}})
        report_id = store.save_report(title="GSM8K, m1 vs m2", run_ids=["run-a", "run-b"], markdown="",
                                      data={"summaries": summaries, "pareto_frontier": ["m1", "m2"]}, png=png)
    finally:
        store.close()

    browser_login(page)
    page.goto("/console/evals")
    partial = page.locator("#runs tbody tr", has_text="run-partial").locator("td")
    assert [partial.nth(i).inner_text() for i in (5, 6, 7)] == ["stopped", "–", "–"]
    screenshot(page, "07-evals")
    page.click("text=GSM8K, m1 vs m2")
    page.wait_for_url(f"**/console/evals/reports/{report_id}")
    plot = page.locator("#report-plot")
    plot.scroll_into_view_if_needed()
    page.wait_for_function("document.getElementById('report-plot').complete")
    assert page.evaluate("[document.getElementById('report-plot').naturalWidth, "
                         "document.getElementById('report-plot').naturalHeight]") == list(_png_size(png))
    assert page.locator("#report-table tbody tr").count() == 2
    assert fits_the_window(page)
    screenshot(page, "08-report")

    page.goto("/console/evals/compare?a=run-a&b=run-b")
    rows = {r.locator("td").nth(1).inner_text(): r.locator("td").nth(4).inner_text()
            for r in page.locator("#compare tbody tr").all()}
    assert rows["score"] == "+0.15" and rows["cost_usd"] == "$0"  # both runs cost $0.02
    assert fits_the_window(page)
    screenshot(page, "09-compare")


def test_keys_create_shown_once_and_revoke(page, console_gateway, screenshot):
    browser_login(page)
    page.goto("/console/keys")
    page.fill("#key-name", "console-key")
    page.fill("#key-budget", "abc")
    page.click("button:has-text('Create')")
    assert "budget_usd must be a number" in page.locator(".field.invalid .field-error").inner_text()
    for bad in ("nan", "inf", "1e309"):  # not finite: a field error, never a 500
        page.fill("#key-budget", bad)
        page.click("button:has-text('Create')")
        assert page.locator(".field.invalid .field-error").inner_text() == f"budget_usd must be a finite number, got '{bad}'"
    page.fill("#key-budget", "12.5")
    page.fill("#key-rpm", str(10**40))  # beyond the column: the API's range error, beside the field
    page.click("button:has-text('Create')")
    assert "less than or equal to 2147483647" in page.locator(".field.invalid #key-rpm ~ .field-error").inner_text()
    page.fill("#key-rpm", "60")
    page.click("button:has-text('Create')")
    page.wait_for_url("**/console/keys")  # Post/Redirect/Get: the page shown is a GET
    plaintext = page.locator("#created-key pre").inner_text()
    assert plaintext.startswith("sk-link-")
    key_id = int(page.locator("#created-key h2").inner_text().split()[1])
    named = lambda: [k for k in api(console_gateway, "GET", "/api/keys").json() if k["name"] == "console-key"]  # noqa: E731
    assert [k["id"] for k in named()] == [key_id]
    row = page.locator(f"tr[data-key-id='{key_id}']")
    assert row.locator("input[name=budget_usd]").input_value() == "12.5" and row.locator("td").nth(7).inner_text() == "60"
    chat = httpx.post(console_gateway.base_url + "/chat/completions", headers={"Authorization": f"Bearer {plaintext}"},
                      json={"model": "m1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
    assert chat.status_code == 200
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "10-keys")
    page.reload()  # a reload neither creates another key nor shows this one again
    assert plaintext not in page.content() and page.locator("#created-key").count() == 0
    assert [k["id"] for k in named()] == [key_id]
    usage = chat.json()["usage"]
    spend = (usage["prompt_tokens"] * MOCK_PRICES["input_cost_per_million"]
             + usage["completion_tokens"] * MOCK_PRICES["output_cost_per_million"]) / 1e6
    assert page.locator(f"tr[data-key-id='{key_id}'] td").nth(5).inner_text() == format_usd(spend)
    budget = page.locator(f"tr[data-key-id='{key_id}'] input[name=budget_usd]")
    budget.fill("3")
    budget.press("Enter")
    page.wait_for_load_state()
    assert api(console_gateway, "GET", f"/api/keys/{key_id}").json()["budget_usd"] == 3.0
    assert page.locator(f"tr[data-key-id='{key_id}'] input[name=budget_usd]").input_value() == "3"  # the exact budget
    page.locator(f"tr[data-key-id='{key_id}']").locator("button:has-text('Revoke')").click()
    page.wait_for_load_state()
    assert page.locator(f"tr[data-key-id='{key_id}'] .badge").inner_text() == "revoked"
    assert api(console_gateway, "GET", f"/api/keys/{key_id}").json()["revoked_at"] is not None


def test_models_page(page, console_gateway, screenshot):
    # the local model loaded (by this request, or by "try it" before), so its engine numbers show
    chat = api(console_gateway, "POST", "/v1/chat/completions",
               json={"model": LOCAL_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert chat.status_code == 200, chat.text
    console_gateway.flush_log()
    browser_login(page)
    page.goto("/console/models")
    names = [c.inner_text() for c in page.locator("#models-table tbody tr td.name").all()]
    assert names == ["m1", "m2", "small", "big", "down", LOCAL_MODEL]
    assert page.locator("tr[data-model='m1'] .badge").inner_text() == "healthy"
    assert page.locator("tr[data-model='m1'] td").nth(3).inner_text() == "$1,000.00"  # USD per million tokens
    local = page.locator(f"tr[data-model='{LOCAL_MODEL}'] td")
    assert local.nth(2).inner_text() == "loaded"
    assert local.nth(7).inner_text() == "0" and local.nth(8).inner_text() == "0"  # running, waiting: idle now
    assert page.locator("tr[data-model='down'] .badge").inner_text() == "error"  # ejected by its health checks
    assert page.locator("tr[data-model='down'] .replica.down").count() == 1
    blocks = api(console_gateway, "GET", "/api/models").json()["data"][5]["engine"]
    assert blocks["kv_blocks_total"] > 0 and blocks["tokens_per_s"] >= chat.json()["usage"]["completion_tokens"] / 60
    assert local.nth(9).inner_text().endswith(f"({blocks['kv_blocks_used']}/{blocks['kv_blocks_total']})")
    with page.expect_response("**/console/models/table", timeout=10_000) as refresh:  # htmx, every 5 s
        pass
    assert refresh.value.status == 200 and page.locator("tr[data-model='m1']").count() == 1
    assert fits_the_window(page), overflowing_cards(page)
    screenshot(page, "11-models")


def fits_the_window(page) -> bool:
    """True when nothing makes the page scroll sideways at the 1280 px window, and no card has to scroll its
    own content sideways either (cards scroll rather than widen the page: that is the last resort, not the layout)."""
    return page.evaluate("document.documentElement.scrollWidth") <= 1280 and not overflowing_cards(page)


def overflowing_cards(page) -> list[str]:
    """The first words of each card whose content is wider than the card."""
    return page.evaluate("[...document.querySelectorAll('.card')].filter(c => c.scrollWidth > c.clientWidth)"
                         ".map(c => c.innerText.slice(0, 40))")


def test_traffic_policy_filter_lists_policies_and_keeps_the_choice(page, console_gateway, screenshot):
    key = api(console_gateway, "POST", "/api/keys", json={"name": "filter-browser"}).json()
    for model in ("from-config", "m2", "from-config"):
        response = httpx.post(console_gateway.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key['key']}"},
                              json={"model": model, "messages": [{"role": "user", "content": "filter me"}]})
        assert response.status_code == 200, response.text
    console_gateway.flush_log()
    browser_login(page)
    page.goto(f"/console/traffic?range=15m&key={key['id']}")
    listed = page.locator("#filter-policy optgroup[label=policies] option").all_inner_texts()
    assert {"from-config", "routed", "mixture"} <= set(listed) and "m1" not in listed
    page.select_option("#filter-policy", "from-config")
    page.click("button:has-text('Apply')")
    page.wait_for_url("**policy=from-config**")
    assert page.input_value("#filter-policy") == "from-config"  # still selected after Apply
    assert page.input_value("#filter-key") == str(key["id"])
    assert page.locator("[data-total=requests]").inner_text() == "2"
    assert [r.locator("td").nth(1).inner_text() for r in page.locator("#request-log tbody tr").all()] == ["from-config"] * 2
    screenshot(page, "05b-traffic-filtered")


def test_no_page_is_wider_than_the_window(page, console_gateway, screenshot):
    """At 1280x800 no page scrolls sideways, also with a 100-character policy name in every table and filter."""
    long_name = "a-policy-with-a-very-long-name-" + "x" * 69
    assert len(long_name) == 100
    created = api(console_gateway, "POST", "/api/policies", json={"name": long_name, "type": "fallback", "models": ["m1", "m2"]})
    assert created.status_code == 201, created.text
    try:
        answered = api(console_gateway, "POST", "/v1/chat/completions",
                       json={"model": long_name, "messages": [{"role": "user", "content": "wide"}]})
        assert answered.status_code == 200, answered.text
        request_id = answered.headers["x-link-request-id"]
        console_gateway.flush_log()
        page.goto("/console/login")
        assert fits_the_window(page)
        browser_login(page)
        pages = {"traffic": "/console/traffic?range=15m", "traffic-long-policy": f"/console/traffic?range=15m&policy={long_name}",
                 "policies": "/console/policies", "policy-new": "/console/policies/new",
                 "policy-edit": f"/console/policies/edit?name={long_name}", "try": f"/console/policies/try?policy={long_name}",
                 "models": "/console/models", "evals": "/console/evals", "keys": "/console/keys",
                 "request": f"/console/requests/{request_id}", "not-found": "/console/no-such-page"}
        for name, path in pages.items():
            page.goto(path)
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, f"{path} is {width} px wide"
            assert overflowing_cards(page) == [], path
            screenshot(page, f"12-fit-{name}")
        page.goto(f"/console/traffic?range=15m&policy={long_name}")
        cell = page.locator("#share-policy tbody tr td.name").first
        assert cell.get_attribute("title") == long_name  # cut with an ellipsis, the whole name on hover
        assert cell.evaluate("td => td.scrollWidth > td.clientWidth")
    finally:
        api(console_gateway, "DELETE", f"/api/policies/{long_name}")


def test_browser_formats_costs_like_the_server(page):
    """web/static/format.js and web/formatting.py write the same USD text (the Traffic cost axis, "try it")."""
    browser_login(page)
    page.goto("/console/traffic")
    values = [0, 0.013, 9.5e-06, 1234.5, 0.123456, 1e-6, 0.99996, 1.2345e-10, 5e-05, 0.00012345, -0.5, 3]
    assert page.evaluate("(values) => values.map(linkFormat.usd)", values) == [format_usd(v) for v in values]
    ticks = page.evaluate("Chart.getChart('chart-cost').scales.y.ticks.map(t => t.label)")
    assert ticks and all(t.startswith("$") and "E" not in t for t in ticks), ticks
