"""The `link` CLI, each subcommand run through Typer's test runner on the real models."""

from __future__ import annotations

from typer.testing import CliRunner

from link.cli import app

runner = CliRunner()


def test_models_lists_the_registry():
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-instruct" in result.output and "gemma-3-270m" in result.output


def test_chat_answers_one_question():
    result = runner.invoke(app, ["chat", "What is the capital of France?", "--model", "smollm2-135m-instruct"])
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output


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
