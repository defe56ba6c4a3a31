"""`link keys create|list|revoke` on SQLite and PostgreSQL (the database fixtures of tests/link/conftest.py,
shared through tests/cli/conftest.py), and `link keys create` with an invalid name, limit or budget: one clean
`error:` line naming the option, exit code 2, and no database touched. No model.

    .venv/bin/python -m pytest -q tests/cli/test_cli_keys.py
"""

from __future__ import annotations

import re

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from cli.app import app
from link.db.models import ApiKey
from link.keys import KEY_PREFIX, verify_key


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


def test_cli_create_list_revoke(db_url, session):
    runner = CliRunner()
    created = runner.invoke(app, ["keys", "create", "cli-user", "--budget-usd", "3", "--rpm", "7", "--database-url", db_url])
    assert created.exit_code == 0, created.output
    plaintext = created.stdout.strip().splitlines()[-1]
    assert plaintext.startswith(KEY_PREFIX)
    identity = verify_key(session, plaintext)
    assert identity.name == "cli-user" and identity.rpm_limit == 7 and identity.budget_usd == 3.0

    listed = runner.invoke(app, ["keys", "list", "--database-url", db_url])
    assert listed.exit_code == 0, listed.output
    assert "cli-user" in listed.stdout and plaintext[:12] in listed.stdout and plaintext not in listed.stdout

    revoked = runner.invoke(app, ["keys", "revoke", str(identity.key_id), "--database-url", db_url])
    assert revoked.exit_code == 0, revoked.output
    assert f"revoked key {identity.key_id}" in revoked.stdout
    assert verify_key(session, plaintext) is None
    active = runner.invoke(app, ["keys", "list", "--active", "--database-url", db_url])
    assert "cli-user" not in active.stdout

    missing = runner.invoke(app, ["keys", "revoke", "999999999", "--database-url", db_url])
    assert missing.exit_code == 2 and "no API key" in missing.output


def test_cli_uses_link_database_url(db_url, monkeypatch, session):
    monkeypatch.setenv("LINK_DATABASE_URL", db_url)
    result = CliRunner().invoke(app, ["keys", "create", "from-env"])
    assert result.exit_code == 0, result.output
    assert session.exec(select(ApiKey).where(ApiKey.name == "from-env")).first() is not None


def test_cli_list_writes_money_with_four_significant_digits(db_url, session, monkeypatch):
    # A budget of $0.00001 and a spend of 12,345 nano-dollars ($0.000012345): "0.0000" would hide both.
    runner = CliRunner()
    created = runner.invoke(app, ["keys", "create", "tiny", "--budget-usd", "0.00001", "--database-url", db_url])
    assert created.exit_code == 0, created.output
    row = session.exec(select(ApiKey).where(ApiKey.name == "tiny")).one()
    row.spend_nusd = 12_345
    session.add(row)
    session.commit()

    monkeypatch.delenv("COLUMNS", raising=False)  # piped with no width: one line per row, however wide
    listed = runner.invoke(app, ["keys", "list", "--database-url", db_url])
    assert listed.exit_code == 0, listed.output
    columns, rows = _rows(listed.stdout)
    cells = next(row for row in rows if row[1] == "tiny")
    money = {name: cells[columns.index(name)] for name in ("budget", "spend", "reserved")}
    assert money == {"budget": "$0.00001", "spend": "$0.00001234", "reserved": "$0"}


HEADERS = ["id", "name", "key", "created", "revoked", "budget", "spend", "reserved", "rpm", "tpm", "traces"]


def _rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of `link keys list`'s table, each row cut at its header's start column."""
    lines = stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("id "))
    starts = [re.search(rf"(?<!\S){name}(?!\S)", header).start() for name in HEADERS]
    body = lines[lines.index(header) + 2:]  # below the rule
    cut = lambda line: [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]  # noqa: E731
    return cut(header), [cut(line) for line in body if line.strip()]


def test_cli_list_at_80_columns_keeps_headers_whole(db_url, monkeypatch):
    # Piped with COLUMNS=80 (a pager, `| less`): Rich's own squeeze cut headers to "creat…" and hid whole
    # columns; the table must fit in 80 columns, fold long cells onto more lines and keep every header whole.
    runner = CliRunner()
    name = "a-rather-long-key-name-for-the-platform-team"
    for args in ([name, "--budget-usd", "0.00001", "--rpm", "600", "--tpm", "100000"], ["bob"]):
        assert runner.invoke(app, ["keys", "create", *args, "--database-url", db_url]).exit_code == 0
    monkeypatch.setenv("COLUMNS", "80")
    listed = runner.invoke(app, ["keys", "list", "--database-url", db_url])
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, listed.stdout
    assert "…" not in listed.stdout
    columns, rows = _rows(listed.stdout)
    assert columns == HEADERS
    # the folded name reads whole again down its column; the tiny budget is not split over lines (where the
    # no-wrap columns cannot all fit, the narrowest stay whole)
    assert name in "".join(row[1] for row in rows)
    assert "$0.00001" in [row[HEADERS.index("budget")] for row in rows]

    monkeypatch.setenv("COLUMNS", "200")  # a wide $COLUMNS is honoured too: one line per key
    wide = runner.invoke(app, ["keys", "list", "--database-url", db_url])
    assert any(name in line for line in wide.stdout.splitlines())
