"""`link --help` and every subcommand's `--help` at 80 columns (COLUMNS=80): each text whole (no "…" cut by a
table, no "..." cut by a command listing), no line past 80 characters, and no tracker numbers.

    .venv/bin/python -m pytest -q tests/cli/test_cli_help.py
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from cli.app import app


def _command_paths(command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """`link`'s command tree as argument paths: (), ("serve",), ("keys",), ("keys", "create"), ..."""
    paths = [path]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        paths += _command_paths(sub, (*path, name))
    return paths


PATHS = _command_paths(typer.main.get_command(app))


def test_the_tree_holds_every_group_and_leaf():
    assert {("keys", "list"), ("compile", "status"), ("eval", "run"), ("posttrain", "sft"), ("engine", "serve"),
            ("router", "train"), ("bench", "gateway"), ("route",)} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(("link", *path)))
def test_help_reads_whole_at_80_columns(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) > 3
    assert "…" not in result.output, result.output
    cut = [line for line in lines if line.rstrip().endswith("...") and not line.startswith("Usage:")]
    assert not cut, cut
    assert max(len(line) for line in lines) <= 80, result.output
    assert not re.search(r"\bissues? *#?\d", result.output, re.I), result.output
