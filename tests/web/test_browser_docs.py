"""`/docs` (Swagger UI) and `/redoc` (ReDoc) render in Chromium with every request off 127.0.0.1 blocked: their
scripts come from package files (protocol/docs.py), not a CDN. Both servers: the gateway and the engine server.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn

from tests.link.gateway_launch import gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import free_port, wait_healthy

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def gateway_url(mock, tmp_path_factory):
    from link.config import parse_config

    home = tmp_path_factory.mktemp("docs-home")
    config = parse_config({"models": [mock_deployment("m1", mock.api_base)]})
    settings = gateway_settings(f"sqlite:///{home / 'link.db'}", home)
    with start_gateway_thread(settings, config) as server:
        yield server.url


@pytest.fixture(scope="module")
def engine_url():
    """The engine server's app with its lifespan off: its pages and OpenAPI schema need no loaded model."""
    from serving.api.server import create_engine_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_engine_app("smollm2-135m-instruct"), host="127.0.0.1", port=port,
                                           lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, 30, path="/openapi.json")
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def offline_page(browser):
    """A page whose requests to any host but 127.0.0.1 fail (as with no network); `page.blocked` lists them."""
    context = browser.new_context()
    page = context.new_page()
    page.blocked = []

    def only_loopback(route):
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            page.blocked.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", only_loopback)
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.mark.parametrize("server, operation", [("gateway_url", "/v1/chat/completions"),
                                               ("engine_url", "/v1/chat/completions")])
def test_docs_and_redoc_render_offline(server, operation, offline_page, request):
    url = request.getfixturevalue(server)
    schema = httpx.get(url + "/openapi.json").json()
    operations = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}

    offline_page.goto(url + "/docs")
    offline_page.wait_for_selector(".opblock")
    shown = {(block.locator(".opblock-summary-method").inner_text(),
              block.locator(".opblock-summary-path").inner_text().replace("\u200b", ""))  # Swagger UI's line breaks
             for block in offline_page.locator(".opblock").all()}
    assert shown == operations and ("POST", operation) in shown

    offline_page.goto(url + "/redoc")
    offline_page.wait_for_selector("[data-section-id^='operation/']", state="attached")
    sections = offline_page.eval_on_selector_all("[data-section-id^='operation/']",
                                                 "nodes => [...new Set(nodes.map(n => n.dataset.sectionId))]")
    assert len(sections) == len(operations)
    # nothing was asked of another host (CDN, fonts), not even ReDoc's built-in "powered by" logo: the pages'
    # Content-Security-Policy keeps the browser on the server's own host, online or not
    assert offline_page.blocked == []
