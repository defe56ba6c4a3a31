"""`link keys create` with an invalid name, limit or budget: one clean `error:` line naming the option,
exit code 2, and no database touched. No model.

    .venv/bin/python -m pytest -q tests/cli/test_cli_keys.py
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.app import app


@pytest.mark.parametrize("args, line", [
    ([""], "error: NAME must not be empty"),
    (["alice", "--rpm", "-5"], "error: --rpm must be at least 1 (got -5)"),
    (["alice", "--tpm", "0"], "error: --tpm must be at least 1 (got 0)"),
    (["alice", "--budget-usd", "-1"], "error: --budget-usd must be at least 0 (got -1)"),
])
def test_invalid_key_options_are_one_clean_line(tmp_path, args, line):
    url = f"sqlite:///{tmp_path / 'link.db'}"
    result = CliRunner().invoke(app, ["keys", "create", *args, "--database-url", url])
    assert result.exit_code == 2
    assert result.output.strip() == line, result.output
    assert not (tmp_path / "link.db").exists()  # refused before the database is opened
