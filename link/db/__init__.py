"""Persistence: the database engine (SQLite or PostgreSQL), the SQLModel tables and Alembic migrations.

    engine = make_db_engine(settings.database_url)
    upgrade(settings.database_url)           # schema to head; idempotent, safe across processes
"""

from link.db import evals, ledger, responses  # importing them registers the eval, budget reservation and stored
# response tables on SQLModel.metadata
from link.db.engine import make_db_engine, normalize_url
from link.db.migrate import upgrade

__all__ = ["evals", "ledger", "responses", "make_db_engine", "normalize_url", "upgrade"]
