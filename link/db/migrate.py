"""Schema migrations (Alembic), run programmatically: `upgrade(url)` brings a database to the newest schema.

    from link.db.migrate import upgrade
    upgrade("sqlite:////home/me/.link/link.db")      # at app start; idempotent

Safe when several gateway processes start at once: the upgrade runs inside one transaction that first
takes a database-wide lock (PostgreSQL: `pg_advisory_xact_lock`; SQLite: `BEGIN IMMEDIATE`, the write
lock), so one process migrates and the others then find the schema at head and do nothing. Both
databases have transactional DDL, so a failed upgrade leaves the schema as it was.

A new revision (developers): `alembic_config(url)` gives the Config for `alembic.command.revision(cfg,
message, autogenerate=True)`; see tests/link/test_db.py for the drift check.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from link.db.engine import make_db_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary 64-bit constant naming the migration lock among PostgreSQL advisory locks ("link" in ASCII).
ADVISORY_LOCK_ID = 0x6C696E6B


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config pointing at the packaged migrations; `connection` is handed to env.py."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision id of the packaged migrations."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision a database is at; None for an empty (never migrated) database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind `engine` to `revision` under the migration lock.

    Raises:
        sqlalchemy.exc.OperationalError: the database is unreachable, or the SQLite lock was not
            granted within the busy timeout.
    """
    with engine.connect() as connection:
        is_sqlite = engine.dialect.name == "sqlite"
        if is_sqlite:
            # pysqlite opens transactions only before DML; take the write lock explicitly so the DDL and
            # the alembic_version update form one transaction that other processes wait for.
            sqlite_connection = connection.connection.driver_connection
            saved_isolation = sqlite_connection.isolation_level
            sqlite_connection.isolation_level = None
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": ADVISORY_LOCK_ID})
        try:
            command.upgrade(alembic_config(connection), revision)
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        finally:
            if is_sqlite:
                sqlite_connection.isolation_level = saved_isolation


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision` (default: the newest); a no-op when already there.

    Args:
        url: a SQLite or PostgreSQL URL, as for `link.db.engine.make_db_engine`.
        revision: an Alembic revision id or "head".

    Raises:
        ValueError: an unsupported database URL.
        sqlalchemy.exc.OperationalError: the database is unreachable.
    """
    engine = make_db_engine(url, pool_size=1)
    try:
        upgrade_engine(engine, revision)
    finally:
        engine.dispose()
