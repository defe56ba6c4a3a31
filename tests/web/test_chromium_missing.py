"""Without Chromium the browser tests skip with the reason, except under CI (`CI=true`), where they fail."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.link.mock_launch import ROOT

BROWSER_TEST = "tests/web/test_browser.py::test_login_redirect_and_logout"


@pytest.mark.parametrize("ci,outcome", [("", "1 skipped"), ("true", "1 error")])
def test_browser_tests_without_chromium(ci, outcome):
    env = {**os.environ, "LINK_TEST_CHROMIUM": "/nonexistent/chromium", "CI": ci}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", BROWSER_TEST],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert outcome in result.stdout, result.stdout[-2000:]
    assert "Chromium not found at /nonexistent/chromium" in result.stdout
    assert result.returncode == (0 if not ci else 1)
