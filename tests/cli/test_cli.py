"""The `link` CLI, each subcommand run through Typer's test runner on the real models."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from cli.app import app

runner = CliRunner()


def test_models_lists_the_registry():
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"):
        assert name in result.output


@pytest.mark.slow
def test_chat_answers_one_question_and_reports_the_load_on_stderr():
    result = runner.invoke(app, ["chat", "What is the capital of France?", "--model", "smollm2-135m-instruct"])
    assert result.exit_code == 0, result.output
    assert "Paris" in result.stdout and "load" not in result.stdout  # stdout: the answer only
    first, done = result.stderr.splitlines()[:2]
    assert first == "loading smollm2-135m-instruct ..."
    assert re.fullmatch(r"loaded smollm2-135m-instruct in \d+\.\d s \(\d+\.\d MB resident\)", done), done


@pytest.mark.slow
def test_interactive_chat_keeps_history_until_exit():
    session = "What is the capital of France?\n/reset\n/exit\nnever read\n"
    result = runner.invoke(app, ["chat", "--max-tokens", "32"], input=session)
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output
    assert "(history cleared)" in result.output


def test_unknown_model_is_a_clear_error():
    result = runner.invoke(app, ["chat", "hi", "--model", "gpt-17"])
    assert result.exit_code == 2
    assert "unknown model 'gpt-17'" in result.output and "smollm2-135m-instruct" in result.output


def test_engine_serve_unknown_model_is_a_clear_error():
    result = runner.invoke(app, ["engine", "serve", "--model", "nope"])
    assert result.exit_code == 2
    assert "unknown model 'nope'; available: gemma-3-270m, qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct, smollm2-135m-instruct" in result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.slow
def test_engine_serve_starts_an_openai_server():
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "cli", "engine", "serve", "--port", str(port), "--kv-cache-mb", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "engine server did not become healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["data"][0]["id"] == "smollm2-135m-instruct"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
