"""`link keys create|list|revoke`: API keys of the gateway, stored hashed in the database.

    link keys create alice --budget-usd 5 --rpm 60     prints the key once
    link keys create harness --capture-traces          its requests with `tools` become tool-call traces
    link keys list [--active]
    link keys revoke ID
"""

from __future__ import annotations

from contextlib import contextmanager

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from cli.errors import fail
from cli.tables import print_table
from link.money import format_usd

keys_app = typer.Typer(help="API keys of the gateway (stored hashed in the database).", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


@contextmanager
def _keys_session(database_url: str | None):
    """A session on the gateway database (`--database-url`, else LINK_DATABASE_URL / settings), migrated."""
    from pydantic import ValidationError
    from sqlmodel import Session

    from link.db import make_db_engine, upgrade
    from link.settings import get_settings

    try:
        url = database_url or get_settings().database_url
    except ValidationError as exc:
        raise fail(exc) from None
    upgrade(url)
    engine = make_db_engine(url, pool_size=1)
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


DATABASE_URL_OPTION = typer.Option(None, "--database-url", help="Database URL (default: LINK_DATABASE_URL or $LINK_HOME/link.db).")


_KEY_OPTIONS = {"name": "NAME", "budget_usd": "--budget-usd", "rpm_limit": "--rpm", "tpm_limit": "--tpm"}


def _key_option_error(exc) -> str:
    """A key's pydantic ValidationError -> one line naming the CLI option: "--rpm must be at least 1 (got -5)"."""
    first = exc.errors()[0]
    option = _KEY_OPTIONS.get(str(first["loc"][0]) if first["loc"] else "", "a value")
    ctx, value = first.get("ctx") or {}, first.get("input")
    if first["type"] == "string_too_short":
        return f"{option} must not be empty"
    if first["type"] == "string_too_long":
        return f"{option} must be at most {ctx['max_length']} characters"
    if first["type"] in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return f"{option} must be {'at least' if 'ge' in ctx else 'more than'} {bound:g} (got {value:g})"
    return f"{option}: {first['msg']} (got {value!r})"


@keys_app.command("create")
def keys_create(
    name: str = typer.Argument(..., help="A label for the key."),
    budget_usd: float = typer.Option(None, "--budget-usd", help="Most the key may spend, USD (default: unlimited)."),
    rpm: int = typer.Option(None, "--rpm", help="Requests per minute (default: unlimited)."),
    tpm: int = typer.Option(None, "--tpm", help="Tokens per minute (default: unlimited)."),
    capture_traces: bool = typer.Option(False, "--capture-traces/--no-capture-traces",
                                        help="Record the key's chat requests with `tools` as tool-call traces "
                                             "(GET /api/traces, posttrain)."),
    database_url: str = DATABASE_URL_OPTION,
) -> None:
    """Create an API key; prints the key once (only its hash is stored)."""
    from pydantic import ValidationError

    from link.db.models import ApiKeyCreate
    from link.keys import create_key

    try:  # checked before the database is opened: one line naming the option, exit code 2
        ApiKeyCreate(name=name, budget_usd=budget_usd, rpm_limit=rpm, tpm_limit=tpm)
    except ValidationError as exc:
        raise fail(_key_option_error(exc)) from None
    with _keys_session(database_url) as session:
        key, plaintext = create_key(session, name, budget_usd=budget_usd, rpm_limit=rpm, tpm_limit=tpm,
                                    capture_traces=capture_traces)
    err_console.print(f"created key {key.id} ({key.name}); store it now, it is not shown again:")
    print(plaintext)


@keys_app.command("list")
def keys_list(
    include_revoked: bool = typer.Option(True, "--all/--active", help="Include revoked keys."),
    database_url: str = DATABASE_URL_OPTION,
) -> None:
    """List API keys with their limits, budget and spend."""
    from link.keys import list_keys

    with _keys_session(database_url) as session:
        keys = list_keys(session, include_revoked=include_revoked)
    # light rules and two spaces between columns: eleven columns fit at 80 (folding cells), see cli/tables.py
    table = Table(title="API keys", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for column in ("id", "name", "key", "created", "revoked", "budget", "spend", "reserved", "rpm", "tpm", "traces"):
        table.add_column(column, no_wrap=column in ("key", "created", "budget", "spend", "reserved"))
    for key in keys:
        table.add_row(str(key.id), key.name, key.key_prefix + "...", f"{key.created_at:%Y-%m-%d %H:%M}",
                      f"{key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "",
                      "-" if key.budget_usd is None else format_usd(key.budget_usd), format_usd(key.spend_usd),
                      format_usd(key.reserved_usd), str(key.rpm_limit or "-"), str(key.tpm_limit or "-"),
                      "on" if key.capture_traces else "-")
    print_table(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: int = typer.Argument(..., help="The key's id (see `link keys list`)."),
    database_url: str = DATABASE_URL_OPTION,
) -> None:
    """Revoke an API key: running gateways refuse it within 2 seconds (they cache verified keys that long)."""
    from link.keys import KeyNotFound, revoke_key

    with _keys_session(database_url) as session:
        try:
            key = revoke_key(session, key_id)
        except KeyNotFound as exc:
            raise fail(exc) from None
    console.print(f"revoked key {key.id} ({key.name}, {key.key_prefix}...)")

