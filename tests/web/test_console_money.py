"""Money on the console's Keys page: the budget field holds the exact stored value (saving the form unchanged
keeps it), and the table's amounts follow web/formatting.py's rule (four significant digits below a dollar)."""

from __future__ import annotations

import re

import httpx

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import csrf_from

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


def _key_row(html: str, key_id: int) -> str:
    match = re.search(rf'<tr data-key-id="{key_id}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"key {key_id} is not listed"
    return match.group(1)


def _budget_field(row: str) -> str:
    match = re.search(r'<input name="budget_usd" value="([^"]*)"', row)
    assert match, "the row has no budget field"
    return match.group(1)


def test_the_budget_field_holds_the_exact_budget_and_saving_it_keeps_it(admin, console_gateway):
    created = httpx.post(console_gateway.url + "/api/keys", headers=AUTH, json={"name": "micro", "budget_usd": 0.00001})
    assert created.status_code in (200, 201), created.text
    key_id = created.json()["id"]

    row = _key_row(admin.get("/console/keys").text, key_id)
    assert _budget_field(row) == "0.00001"  # was "0.00": saving that would have set a $0 budget
    assert '<td class="num">$0</td><td class="num">$0</td>' in row  # spend and reserved

    token = csrf_from(admin.get("/console/keys").text)
    saved = admin.post("/console/keys/budget", data={"key_id": str(key_id), "budget_usd": _budget_field(row),
                                                     "csrf_token": token})
    assert saved.status_code == 303, saved.text
    key = next(k for k in httpx.get(console_gateway.url + "/api/keys", headers=AUTH).json() if k["id"] == key_id)
    assert key["budget_usd"] == 0.00001


def test_a_revoked_keys_budget_is_written_by_the_money_rule(admin, console_gateway):
    created = httpx.post(console_gateway.url + "/api/keys", headers=AUTH, json={"name": "gone", "budget_usd": 0.000012345})
    key_id = created.json()["id"]
    assert httpx.delete(f"{console_gateway.url}/api/keys/{key_id}", headers=AUTH).status_code in (200, 204)
    row = _key_row(admin.get("/console/keys").text, key_id)
    assert '<td class="num">$0.00001234</td>' in row  # 1.2344999...e-05, the nearest double: rounds down
