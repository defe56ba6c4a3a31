"""`link engine serve` tunes its kernels by itself: a real server on SmolLM2 with a fresh $LINK_HOME gets traffic,
then, in its idle gap, persists winners in $LINK_HOME/compile/winners.sqlite and installs them (its /metrics);
with `--no-auto-tune` it persists nothing. Both servers load side by side (one fixture), and the quiet one gets
its traffic at once, so its idle wait runs while the other test does."""

from __future__ import annotations

import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from benchmarks.link_bench.processes import ServerProcess, free_port, python_env
from kernels.winners import WinnerTable

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8, "temperature": 0}
TUNE_WITHIN_S = 900  # every recorded bucket, our C++ decode step's first build included, on a busy 2-core CPU
QUIET_S = 6.0  # three times the idle gap after which a tuner would start


def fresh_home(tmp_path: Path) -> Path:
    """A new $LINK_HOME sharing the test session's model caches (read-only use)."""
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    shared = Path(os.environ["LINK_HOME"]) / "cache"
    for name in ("models", "tokenizers"):
        if (shared / name).exists():
            (home / "cache" / name).symlink_to(shared / name)
    return home


def start(home: Path, *flags: str) -> ServerProcess:
    """A server loading in the background (`wait_healthy` before use)."""
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "engine", "serve", "--model", MODEL, "--port", str(port), "--kv-cache-mb", "32", *flags]
    return ServerProcess(cmd, port, env=python_env(LINK_HOME=str(home)))


def metric(text: str, name: str) -> dict[tuple, float]:
    """{labels as sorted (key, value) pairs: value} of one metric family in a Prometheus text page."""
    out = {}
    for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} ([0-9.e+-]+|NaN)$", text, re.M):
        out[tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return out


def chat(server: ServerProcess) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=120)
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{"tuning": (server, home), "quiet": (server, home, when its traffic ended)}: a default server and a
    `--no-auto-tune` one, started together; the quiet one has had its two requests."""
    tuning_home, quiet_home = (fresh_home(tmp_path_factory.mktemp(name)) for name in ("tuning", "quiet"))
    tuning, quiet = start(tuning_home), start(quiet_home, "--no-auto-tune")
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.wait_healthy(timeout_s=300), (tuning, quiet)))
        for _ in range(2):
            chat(quiet)
        yield {"tuning": (tuning, tuning_home), "quiet": (quiet, quiet_home, time.monotonic())}
    finally:
        for server in (tuning, quiet):
            server.stop(timeout_s=10)


def test_a_fresh_server_tunes_persists_and_installs_its_winners(servers):
    server, home = servers["tuning"]
    for _ in range(2):
        chat(server)
    deadline = time.monotonic() + TUNE_WITHIN_S
    while True:  # every recorded bucket tuned: none pending, at least one verdict
        page = httpx.get(server.url + "/metrics").text
        tuned = sum(metric(page, "link_kernel_autotune_buckets").values())
        pending = sum(metric(page, "link_kernel_autotune_pending").values())
        if tuned and not pending:
            break
        assert time.monotonic() < deadline, f"not tuned in {TUNE_WITHIN_S} s:\n{server.output()}"
        time.sleep(0.5)
    table = WinnerTable(home / "compile" / "winners.sqlite")
    rows = [r for r in table.results() if r.env.model == MODEL]
    winners = {(r.bucket.op, r.bucket.label, r.variant) for r in rows if r.status == "winner"}
    assert len(winners) == tuned  # one verdict per tuned bucket, persisted
    assert table.counts(MODEL)  # the recorded shapes too (`link compile tune --workload recorded`)
    chat(server)  # a step applies what the tuner staged
    page = httpx.get(server.url + "/metrics").text
    installed = {(dict(k)["op"], dict(k)["bucket"], dict(k)["variant"]) for k in metric(page, "link_kernel_winner_speedup")}
    assert installed == {w for w in winners if w[2] != "default"}
    by_outcome = {dict(k)["outcome"]: v for k, v in metric(page, "link_kernel_autotune_buckets").items()}
    assert by_outcome["winner"] == len(installed)
    assert "auto-tuned" in server.output(200_000)  # the log says what was tuned


def test_no_auto_tune_persists_nothing(servers):
    server, home, traffic_ended = servers["quiet"]
    time.sleep(max(0.0, traffic_ended + QUIET_S - time.monotonic()))  # idle for at least QUIET_S
    page = httpx.get(server.url + "/metrics").text
    assert metric(page, "link_kernel_autotune_buckets") == {} and metric(page, "link_kernel_winner_speedup") == {}
    server.stop(timeout_s=10)
    assert not (home / "compile" / "winners.sqlite").exists()
