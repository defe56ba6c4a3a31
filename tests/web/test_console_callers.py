"""The request log's key column on the console: a request refused with a 401 was sent by no accepted key, and
reads "none (refused)", not "master"; a master-key request reads "master" (tests/link/test_request_caller.py
covers stored keys and open mode at the API)."""

from __future__ import annotations

import re

import httpx

from tests.link.gateway_launch import MASTER_KEY

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _shown_key(admin, console_gateway, key: str) -> tuple[int, str]:
    answer = httpx.post(console_gateway.base_url + "/chat/completions", json=BODY,
                        headers={"Authorization": f"Bearer {key}"}, timeout=60)
    console_gateway.flush_log()
    page = admin.get(f"/console/requests/{answer.headers['x-link-request-id']}")
    assert page.status_code == 200, page.text
    return answer.status_code, re.search(r"<dt>key</dt><dd>([^<]*)</dd>", page.text).group(1)


def test_the_request_page_names_no_key_for_a_401_and_the_master_key_for_its_requests(admin, console_gateway):
    assert _shown_key(admin, console_gateway, "sk-link-not-a-key") == (401, "none (refused)")
    assert _shown_key(admin, console_gateway, MASTER_KEY) == (200, "master")


def test_the_traffic_log_names_no_key_for_a_401(admin, console_gateway):
    answer = httpx.post(console_gateway.base_url + "/chat/completions", json=BODY,
                        headers={"Authorization": "Bearer sk-link-refused-in-traffic"}, timeout=60)
    assert answer.status_code == 401
    console_gateway.flush_log()
    request_id = answer.headers["x-link-request-id"]
    page = admin.get("/console/traffic?range=1h").text
    row = re.search(rf'<tr>\s*<td class="time"><a href="/console/requests/{request_id}">.*?</tr>', page, re.S)
    assert row, "the refused request is not in the log"
    assert re.findall(r"<td>([^<]*)</td>\s*</tr>", row.group(0)) == ["none (refused)"]  # the last cell, the key
