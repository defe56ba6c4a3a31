"""Database and Redis fixtures of the gateway tests: every DB test runs on SQLite (a temporary file) and on
the real PostgreSQL at 127.0.0.1:5432 (a fresh, uniquely named database per test session, dropped after).

    LINK_TEST_POSTGRES_URL   server URL (default postgresql://postgres@127.0.0.1:5432); unreachable -> skip
    LINK_TEST_REDIS_URL      Redis URL (default redis://127.0.0.1:6379/0); unreachable -> skip
"""

from __future__ import annotations

import os
import uuid

import pytest

POSTGRES_URL = os.environ.get("LINK_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("LINK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DB_BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def new_database_url(tmp_path_factory):
    """A factory: new_database_url("sqlite" | "postgresql") -> URL of a new, empty database."""
    created: list[str] = []

    def make(backend: str) -> str:
        name = f"link_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
        if backend == "sqlite":
            return f"sqlite:///{tmp_path_factory.mktemp('db') / (name + '.db')}"
        import psycopg

        try:
            with psycopg.connect(f"{POSTGRES_URL}/postgres", autocommit=True, connect_timeout=3) as connection:
                connection.execute(f'CREATE DATABASE "{name}"')
        except psycopg.OperationalError as exc:
            pytest.skip(f"PostgreSQL at {POSTGRES_URL} is not reachable: {exc}")
        created.append(name)
        return f"{POSTGRES_URL}/{name}"

    yield make
    if created:
        import psycopg

        with psycopg.connect(f"{POSTGRES_URL}/postgres", autocommit=True, connect_timeout=3) as connection:
            for name in created:
                connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", params=DB_BACKENDS)
def db_url(request, new_database_url) -> str:
    """A migrated database shared by the tests of one session (tests use their own keys and rows)."""
    from link.db import upgrade

    url = new_database_url(request.param)
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def engine(db_url):
    from link.db import make_db_engine

    engine = make_db_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine):
    from sqlmodel import Session

    with Session(engine) as session:
        yield session


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.skip(f"Redis at {REDIS_URL} is not reachable: {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def unique_prefix() -> str:
    """A Redis / counter key prefix no other test (or run) uses."""
    return f"link-test:{uuid.uuid4().hex[:12]}"
