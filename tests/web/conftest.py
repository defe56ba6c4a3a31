"""Fixtures of the console tests: one gateway on loopback (SQLite in a temporary folder) over a mock OpenAI
provider (models `m1`, `m2`, `down` at a refused port, the Mixture-of-Agents `mixture` over them, and `small`, `big` behind the router
policy `routed`, a fixed-score test router)
and the real local `smollm2-135m-instruct` (loaded only by the tests that use it), an httpx client logged in
to the console, and Chromium driven by Playwright.

Chromium is the system one (`/usr/bin/chromium`, Debian's package; `.ci/run` installs it): without it the
browser tests skip, except under CI (`CI=true`), where they fail.

Screenshots (the `screenshot` fixture, full pages at 1280x800) go to `$LINK_SCREENSHOT_DIR` when it is set, else to
`console-shots/` under the session's pytest temporary folder (printed by `pytest -v`; never inside the repository):

    LINK_SCREENSHOT_DIR=/tmp/shots .venv/bin/python -m pytest -q tests/web/test_browser.py
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url, start_mock_thread

CHROMIUM = os.environ.get("LINK_TEST_CHROMIUM", "/usr/bin/chromium")
LOCAL_MODEL = "smollm2-135m-instruct"
# Prices of the mock models (USD per million tokens): the Traffic test recomputes costs from them.
MOCK_PRICES = {"input_cost_per_million": 1000.0, "output_cost_per_million": 2000.0}
SCREENSHOT_DIR_ENV = "LINK_SCREENSHOT_DIR"


@pytest.fixture(scope="session")
def console_gateway(tmp_path_factory):
    """The gateway (console mounted), its mock provider behind `m1`, `m2`, `small` and `big`, and the local SmolLM2."""
    from link.config import parse_config
    from routers.base import ROUTERS
    from tests.link.router_fakes import TableRouter, save_table_router

    home = tmp_path_factory.mktemp("console-home")
    router_file = save_table_router(home / "routed.safetensors", ["small", "big"], cost_penalty=20.0)
    with start_mock_thread() as mock:
        config = parse_config({
            "models": [*(mock_deployment(name, mock.api_base, **MOCK_PRICES) for name in ("m1", "m2", "small", "big")),
                       mock_deployment("down", refused_url(), **MOCK_PRICES),  # health checks eject it: "error"
                       {"name": LOCAL_MODEL, "kind": "local", "local": LOCAL_MODEL,
                        "input_cost_per_million": 0.02, "output_cost_per_million": 0.02}],
            "policies": [{"name": "from-config", "type": "fallback", "models": ["m1", "m2"]},
                         {"name": "routed", "type": "router", "models": ["small", "big"],
                          "options": {"path": str(router_file)}},
                         {"name": "mixture", "type": "moa", "models": ["m1", "m2"], "options": {"aggregator": "m2"}}]})
        settings = gateway_settings(f"sqlite:///{home / 'link.db'}", home)
        with start_gateway_thread(settings, config) as server:
            wait_ejected(server, "down")
            yield server
    ROUTERS.pop(TableRouter.type, None)


def wait_ejected(server, model: str, timeout_s: float = 15.0) -> None:
    """Wait until /health reports `model` unavailable (its replicas ejected by the health checks)."""
    deadline = time.monotonic() + timeout_s
    while model not in httpx.get(server.url + "/health").json().get("unavailable_models", []):
        assert time.monotonic() < deadline, f"{model} not ejected within {timeout_s} s"
        time.sleep(0.1)


def csrf_from(html: str) -> str:
    """The CSRF token a console page carries (its `<meta name="csrf-token">`)."""
    match = re.search(r'<meta name="csrf-token" content="([^"]+)"', html)
    assert match, "page has no CSRF token"
    return match.group(1)


def login(client: httpx.Client, key: str = MASTER_KEY) -> httpx.Response:
    """Log `client` in through the login form; returns the answer to the form post."""
    token = csrf_from(client.get("/console/login").text)
    return client.post("/console/login", data={"key": key, "csrf_token": token})


@pytest.fixture
def admin(console_gateway):
    """An httpx client logged in to the console (cookies kept, redirects not followed)."""
    with httpx.Client(base_url=console_gateway.url, timeout=60) as client:
        assert login(client).status_code == 303
        yield client


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if shutil.which(CHROMIUM) is None:
        message = f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium_path):
    """Chromium under Playwright's sync API, for one test module: that API runs an event loop in the main thread
    until it stops, so a session-wide browser made every later `asyncio.run` of the session fail ("cannot be called
    from a running event loop")."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, console_gateway):
    """A fresh browser page (1280x800, its own cookies) that accepts confirm() dialogs."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=console_gateway.url)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.set_default_timeout(20_000)
    yield page
    context.close()


def browser_login(page) -> None:
    page.goto("/console/login")
    page.fill("#key", MASTER_KEY)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/traffic")


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory) -> Path:
    """Where screenshots go: $LINK_SCREENSHOT_DIR, else <pytest's session temporary folder>/console-shots."""
    configured = os.environ.get(SCREENSHOT_DIR_ENV)
    folder = Path(configured) if configured else tmp_path_factory.getbasetemp() / "console-shots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def screenshot(screenshot_dir):
    """screenshot(page, name) saves a full-page PNG `<name>.png` in `screenshot_dir` and returns its path."""
    def save(page, name: str) -> Path:
        path = screenshot_dir / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
