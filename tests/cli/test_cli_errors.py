"""The CLI's error line: text, not markup, on one line, exit code 2."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from cli.errors import fail


def test_an_error_prints_brackets_as_text_on_one_line():
    app = typer.Typer()

    @app.command()
    def main() -> None:
        raise fail("options.scorer must be one of ('judge',), got '[/x]' or [bold]y[/bold] " + "long " * 40)

    result = CliRunner().invoke(app, [])
    assert result.exit_code == 2
    assert result.output.startswith("error: options.scorer must be one of ('judge',), got '[/x]' or [bold]y[/bold]")
    assert len(result.output.strip().splitlines()) == 1
