"""The database engine: SQLite by default, PostgreSQL when the URL says so; one code path for both.

    engine = make_db_engine("sqlite:////home/me/.link/link.db")
    engine = make_db_engine("postgresql://postgres@127.0.0.1:5432/link")   # -> postgresql+psycopg://

SQLite connections get WAL journaling (readers never block the one writer), a busy timeout (a writer
waits for the lock instead of failing at once, also across processes) and foreign keys on. Every
connection is set up by a `connect` event, so pooled and new connections behave the same.

`is_unreachable(exc)` tells a database that did not answer (refused, dropped, shutting down) from a statement
it refused; `unreachable_cause(exc)` is the driver's first line, for an error message.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalize_url(url: str) -> str:
    """Map `postgres://` and `postgresql://` (no driver) to `postgresql+psycopg://`; other URLs unchanged.

    Raises:
        ValueError: a backend other than SQLite or PostgreSQL.
    """
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix):]
    backend = make_url(url).get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(f"unsupported database URL {make_url(url).render_as_string(hide_password=True)!r}: "
                         "use sqlite:///path or postgresql://user@host:port/db")
    return url


def make_db_engine(url: str, *, echo: bool = False, sqlite_synchronous: str = "NORMAL",
                   pool_size: int = 10) -> Engine:
    """Create the SQLAlchemy engine for a database URL.

    Args:
        url: `sqlite:///relative.db`, `sqlite:////abs/path.db`, `postgresql://...` (normalized to psycopg 3)
            or `postgresql+psycopg://...`. The parent folder of a SQLite file is created.
        echo: log every statement.
        sqlite_synchronous: SQLite `PRAGMA synchronous`: "NORMAL" (with WAL: every commit survives a crash
            of the process; the last commits can be lost on power loss) or "FULL" (fsync per commit).
        pool_size: connections kept open per process (PostgreSQL; SQLite files use the same pool class).

    Raises:
        ValueError: an unsupported backend.
    """
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(url, echo=echo, pool_pre_ping=True, pool_size=pool_size, max_overflow=2 * pool_size)
    database = parsed.database or ""
    is_file = bool(database) and database != ":memory:" and not database.startswith("file:")
    if is_file:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # An in-memory database lives in one connection (SQLAlchemy's SingletonThreadPool takes no overflow).
    pool_args = {"pool_size": pool_size, "max_overflow": 2 * pool_size} if is_file else {}
    engine = create_engine(url, echo=echo, **pool_args,
                           connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    synchronous = sqlite_synchronous.upper()
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA, not {sqlite_synchronous!r}")

    @event.listens_for(engine, "connect")
    def _set_sqlite_pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.close()

    return engine


def is_postgresql(engine: Engine) -> bool:
    """True when the engine talks to PostgreSQL (else SQLite)."""
    return engine.dialect.name == "postgresql"


def is_unreachable(exc: BaseException) -> bool:
    """True when `exc` says the database did not answer: connection refused or lost, the server shutting down or
    starting up (sqlalchemy's OperationalError or InterfaceError, which wrap the driver's); False for a statement
    the database refused (a constraint, a bad value)."""
    return isinstance(exc, (OperationalError, InterfaceError))


def unreachable_cause(exc: BaseException) -> str:
    """The driver's first line of a connection failure ("connection failed: ... Connection refused"), for a message."""
    original = getattr(exc, "orig", None) or exc
    lines = str(original).strip().splitlines()
    return lines[0] if lines else type(original).__name__
