"""The console in real Chromium against a gateway on loopback: log in, policies (create, edit, a validation
error, delete), "try it" with the local SmolLM2, Traffic totals for 20 requests, an eval report's plot, keys,
models. Each test saves screenshots (1280x800) under LINK_CONSOLE_SHOTS (default /work/console-shots)."""

from __future__ import annotations

import math
import struct
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import LOCAL_MODEL, MOCK_PRICES, browser_login, screenshot

pytestmark = pytest.mark.browser
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


def api(gateway, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, gateway.url + path, headers=AUTH, timeout=60, **kwargs)


def test_login_redirect_and_logout(page):
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


def test_policy_create_edit_invalid_delete(page, console_gateway):
    browser_login(page)
    page.click("nav >> text=Policies")
    page.click("text=New policy")
    page.fill("#name", "browser-policy")
    page.fill("#type", "fallback")
    page.fill("#models", "m1, m2")
    page.fill("#options", '{"note": "from the browser"}')
    page.click("button:has-text('Create')")
    page.wait_for_url("**/console/policies")
    row = page.locator("tr[data-policy='browser-policy']")
    assert row.locator("td").nth(2).inner_text() == "m1, m2"
    assert api(console_gateway, "GET", "/api/policies/browser-policy").json()["options"] == {"note": "from the browser"}

    row.locator("text=Edit").click()
    assert page.input_value("#models") == "m1, m2"
    page.fill("#models", "m2, m1")
    page.click("button:has-text('Save')")
    page.wait_for_url("**/console/policies")
    assert page.locator("tr[data-policy='browser-policy'] td").nth(2).inner_text() == "m2, m1"

    page.locator("tr[data-policy='browser-policy']").locator("text=Edit").click()
    page.fill("#type", "fixed")  # a fixed policy takes exactly one model: the API names `models`
    page.click("button:has-text('Save')")
    error = page.locator("#models-error")
    assert error.is_visible() and "model" in error.inner_text()
    assert page.locator(".field.invalid #models").count() == 1
    assert page.input_value("#type") == "fixed"  # what was typed is kept
    screenshot(page, "03-policy-form-error")
    page.fill("#options", "{not json")
    page.click("button:has-text('Save')")
    assert "options must be JSON" in page.locator("#options-error").inner_text()
    assert api(console_gateway, "GET", "/api/policies/browser-policy").json()["models"] == ["m2", "m1"]

    page.goto("/console/policies")
    screenshot(page, "02-policies")
    page.locator("tr[data-policy='browser-policy']").locator("button:has-text('Delete')").click()
    page.wait_for_load_state()
    assert page.locator("tr[data-policy='browser-policy']").count() == 0
    assert api(console_gateway, "GET", "/api/policies/browser-policy").status_code == 404


def test_try_it_with_the_local_model(page, console_gateway):
    browser_login(page)
    page.goto(f"/console/policies/try?policy={LOCAL_MODEL}")
    page.fill("#try-prompt", "What is the capital of France?")
    page.fill("#try-max-tokens", "8")
    page.click("#try-run")
    page.wait_for_function("document.getElementById('try-status').textContent.startsWith('Done')", timeout=240_000)
    answer = page.locator("#try-answer").inner_text()
    assert answer.strip()
    assert page.locator("#try-chosen").inner_text() == LOCAL_MODEL
    assert page.locator("#try-scores tbody tr td").first.inner_text() == LOCAL_MODEL
    screenshot(page, "04-try-it")
    request_id = page.locator("#try-status").inner_text().split("request ")[1].rstrip(").")
    console_gateway.flush_log()
    row = api(console_gateway, "GET", f"/api/requests/{request_id}").json()
    assert row["model"] == LOCAL_MODEL and row["stream"] is True and 1 <= row["completion_tokens"] <= 8
    usage = page.locator("#try-usage").inner_text()  # the latency is rounded by the page: not compared exactly
    assert usage.startswith(f"{row['prompt_tokens']} prompt + {row['completion_tokens']} completion tokens · "
                            f"${row['cost_usd']:.6f} · ") and usage.endswith(" ms")


def test_try_it_shows_the_routers_decision(page):
    """The test router's table (router_fakes): for a "math" prompt small 0.2, big 0.9; expected costs 0.001 and
    0.01 USD; at lambda 20, big's objective 0.9 - 0.2 beats small's 0.2 - 0.02."""
    browser_login(page)
    page.goto("/console/policies/try?policy=routed")
    page.fill("#try-prompt", "a math question")
    page.click("#try-run")
    page.wait_for_function("document.getElementById('try-status').textContent.startsWith('Done')")
    rows = [[c.inner_text() for c in r.locator("td").all()] for r in page.locator("#try-scores tbody tr").all()]
    assert rows == [["small", "0.2000", "0.00100", ""], ["big", "0.9000", "0.0100", "chosen"]]
    assert page.locator("#try-chosen").inner_text() == "big"
    assert page.locator("#try-answer").inner_text() == "You said: a math question"
    # the mock counts one token per word: 3 prompt + 5 completion tokens at the mock prices
    assert page.locator("#try-usage").inner_text().startswith("3 prompt + 5 completion tokens · $0.013000 · ")
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


def test_traffic_shows_twenty_requests_with_their_totals(page, console_gateway):
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
    assert total("cost_usd") == f"${cost:.6f}"
    assert total("errors") == "0"
    shares = {r.locator("td").nth(0).inner_text(): int(r.locator("td").nth(1).inner_text())
              for r in page.locator("#share-model tbody tr").all()}
    assert shares == {m: sum(1 for model, _, _ in usages if model == m) for m in ("m1", "m2")}
    policies = {r.locator("td").nth(0).inner_text(): int(r.locator("td").nth(1).inner_text())
                for r in page.locator("#share-policy tbody tr").all()}
    assert policies == {"m1": 7, "m2": 7, "from-config": 6}
    assert page.locator("#request-log tbody tr").count() == 20
    assert page.locator("canvas#chart-requests").bounding_box()["height"] > 100
    screenshot(page, "05-traffic")

    minute = "%Y-%m-%dT%H:%M"  # a custom range (the form's datetime-local fields, UTC)
    after = datetime.now(timezone.utc) + timedelta(minutes=1)
    page.goto(f"/console/traffic?key={key['id']}&since={before - timedelta(minutes=1):{minute}}&until={after:{minute}}")
    assert total("requests") == "20" and total("prompt_tokens") == f"{prompt:,}"
    page.goto(f"/console/traffic?key={key['id']}&since={before - timedelta(minutes=9):{minute}}"
              f"&until={before - timedelta(minutes=2):{minute}}")
    assert total("requests") == "0" and total("cost_usd") == "$0.000000"
    page.goto(f"/console/traffic?range=15m&key={key['id']}")

    page.locator("#request-log tbody tr a").first.click()  # the newest request
    page.wait_for_url("**/console/requests/**")
    last = usages[-1][2]
    facts = page.locator("dl.facts").all_inner_texts()
    assert f"prompt tokens\n{last['prompt_tokens']}" in "\n".join(facts)
    assert f"completion tokens\n{last['completion_tokens']}" in "\n".join(facts)
    screenshot(page, "06-request")


def test_request_page_shows_the_moa_proposers_escaped(page, console_gateway):
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
    assert f"prompt tokens\n{row['prompt_tokens']}" in facts and f"cost\n${row['cost_usd']:.6f}" in facts
    calls = [[c.inner_text() for c in r.locator("td").all()] for r in page.locator("#calls tbody tr").all()]
    assert [c[0] for c in calls] == [c["model"] for c in row["decision"]["calls"]]
    assert sum(int(c[2]) for c in calls) == row["prompt_tokens"]  # every call is billed to the request
    screenshot(page, "06b-request-moa")


def _png_size(data: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return width, height


def test_eval_report_plot_and_compare(page, console_gateway, tmp_path):
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
    screenshot(page, "08-report")

    page.goto("/console/evals/compare?a=run-a&b=run-b")
    rows = {r.locator("td").nth(1).inner_text(): r.locator("td").nth(4).inner_text()
            for r in page.locator("#compare tbody tr").all()}
    assert rows["score"] == "+0.15"
    screenshot(page, "09-compare")


def test_keys_create_shown_once_and_revoke(page, console_gateway):
    browser_login(page)
    page.goto("/console/keys")
    page.fill("#key-name", "console-key")
    page.fill("#key-budget", "abc")
    page.click("button:has-text('Create')")
    assert "budget_usd must be a number" in page.locator(".field.invalid .field-error").inner_text()
    page.fill("#key-budget", "12.5")
    page.fill("#key-rpm", "60")
    page.click("button:has-text('Create')")
    plaintext = page.locator("#created-key pre").inner_text()
    assert plaintext.startswith("sk-link-")
    key_id = int(page.locator("#created-key h2").inner_text().split()[1])
    row = page.locator(f"tr[data-key-id='{key_id}']")
    assert row.locator("input[name=budget_usd]").input_value() == "12.50" and row.locator("td").nth(7).inner_text() == "60"
    chat = httpx.post(console_gateway.base_url + "/chat/completions", headers={"Authorization": f"Bearer {plaintext}"},
                      json={"model": "m1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
    assert chat.status_code == 200
    screenshot(page, "10-keys")
    page.goto("/console/keys")
    assert plaintext not in page.content()  # shown once
    usage = chat.json()["usage"]
    spend = (usage["prompt_tokens"] * MOCK_PRICES["input_cost_per_million"]
             + usage["completion_tokens"] * MOCK_PRICES["output_cost_per_million"]) / 1e6
    assert page.locator(f"tr[data-key-id='{key_id}'] td").nth(5).inner_text() == f"${spend:.6f}"
    budget = page.locator(f"tr[data-key-id='{key_id}'] input[name=budget_usd]")
    budget.fill("3")
    budget.press("Enter")
    page.wait_for_load_state()
    assert api(console_gateway, "GET", f"/api/keys/{key_id}").json()["budget_usd"] == 3.0
    assert page.locator(f"tr[data-key-id='{key_id}'] input[name=budget_usd]").input_value() == "3.00"
    page.locator(f"tr[data-key-id='{key_id}']").locator("button:has-text('Revoke')").click()
    page.wait_for_load_state()
    assert page.locator(f"tr[data-key-id='{key_id}'] .badge").inner_text() == "revoked"
    assert api(console_gateway, "GET", f"/api/keys/{key_id}").json()["revoked_at"] is not None


def test_models_page(page, console_gateway):
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
    assert page.locator("tr[data-model='m1'] td").nth(3).inner_text() == "1000.00"
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
    screenshot(page, "11-models")
