"""Fixtures of the CLI tests: the gateway tests' database fixtures (tests/link/conftest.py), for the commands
that write the database (`link keys`), on SQLite and PostgreSQL.

No `__init__.py` here on purpose: with one, pytest would import this folder as the package `cli` and shadow
the real one.
"""

from tests.link.conftest import db_url, engine, new_database_url, session

__all__ = ["db_url", "engine", "new_database_url", "session"]  # re-exported: pytest finds fixtures by name here
