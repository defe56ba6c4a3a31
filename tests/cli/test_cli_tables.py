"""Tables piped at `$COLUMNS` (cli/tables.py): `link models` at 80 columns folds its long cells instead of cutting
them with "…" and keeps a no-wrap name on one line; with `$COLUMNS` unset a piped table prints one line per row.

    .venv/bin/python -m pytest -q tests/cli/test_cli_tables.py
"""

from __future__ import annotations

from typer.testing import CliRunner

from cli.app import app
from serving.registry import default_registry


def test_models_at_80_columns_fold_cells_and_keep_names_whole(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    assert "…" not in result.stdout  # Rich's own squeeze printed "SmolLM2-135M…"
    for spec in default_registry():
        assert any(spec.name in line for line in lines), spec.name
        # the description reads whole again, folded down its column
        column = "".join(line.split("│")[-2].strip() for line in lines if line.count("│") > 2)
        assert "".join(spec.description.split()) in "".join(column.split())


def test_models_piped_without_columns_print_one_line_per_model(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    result = CliRunner().invoke(app, ["models"])
    for spec in default_registry():
        assert any(spec.name in line and spec.description in line for line in result.stdout.splitlines())
