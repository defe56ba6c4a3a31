"""link.db: engine settings, models, and migrations (on SQLite and PostgreSQL).

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_db.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, SQLModel, select

from link.db import make_db_engine, normalize_url, upgrade
from link.db.migrate import MIGRATIONS_DIR, current_revision, head_revision
from link.db.models import ModelRow, PolicyPublic, PolicyRow, RequestLog, RequestLogCreate

ROOT = Path(__file__).resolve().parents[2]

TABLES = {"api_key", "policy", "model", "request_log", "rate_limit_counter", "tool_trace", "console_session",
          "budget_reservation", "budget_lease", "stored_response"}


def test_normalize_url():
    assert normalize_url("postgresql://u@h:5432/db") == "postgresql+psycopg://u@h:5432/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    with pytest.raises(ValueError, match="unsupported database URL"):
        normalize_url("mysql://root:secret@h/db")


def test_sqlite_connection_settings(tmp_path):
    engine = make_db_engine(f"sqlite:///{tmp_path / 'sub' / 'link.db'}")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()
    assert (tmp_path / "sub" / "link.db").exists()


def test_engine_uses_the_right_driver(engine):
    assert engine.dialect.driver == ("psycopg" if engine.dialect.name == "postgresql" else "pysqlite")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT 1")).scalar() == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_upgrade_creates_the_tables_and_is_idempotent(backend, new_database_url):
    url = new_database_url(backend)
    engine = make_db_engine(url)
    assert current_revision(engine) is None and not TABLES & set(inspect(engine).get_table_names())
    upgrade(url)
    assert TABLES | {"alembic_version"} <= set(inspect(engine).get_table_names())
    assert current_revision(engine) == head_revision() == "0008"
    with Session(engine) as session:
        session.add(PolicyRow(name="keep-me", type="fixed", models=["a"]))
        session.commit()
    upgrade(url)  # second run: nothing changes, data stays
    assert current_revision(engine) == head_revision()
    with Session(engine) as session:
        assert [p.name for p in session.exec(select(PolicyRow))] == ["keep-me"]
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_upgrades_from_separate_processes(backend, new_database_url):
    url = new_database_url(backend)
    code = "import sys; from link.db import upgrade; upgrade(sys.argv[1])"
    processes = [subprocess.Popen([sys.executable, "-c", code, url], cwd=ROOT, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    engine = make_db_engine(url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_models_match_the_migrations(engine):
    """Alembic's autogenerate comparison finds no difference between models.py and the migrated schema."""
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []


def test_migrations_ship_inside_the_package():
    assert (MIGRATIONS_DIR / "env.py").is_file() and (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert (MIGRATIONS_DIR / "__init__.py").is_file() and (MIGRATIONS_DIR / "versions" / "__init__.py").is_file()
    assert '"link.db.migrations" = ["script.py.mako"]' in (ROOT / "pyproject.toml").read_text()


def test_json_columns_and_timestamps_round_trip(session):
    policy = PolicyRow(name="fb-roundtrip", type="fallback", models=["m1", "m2"], options={"timeout_s": 3.5})
    model = ModelRow(name="remote-roundtrip", kind="litellm", config={"model": "openai/gpt-4o-mini", "api_base": None})
    session.add_all([policy, model])
    session.commit()
    session.expire_all()
    loaded = session.exec(select(PolicyRow).where(PolicyRow.name == "fb-roundtrip")).one()
    assert loaded.models == ["m1", "m2"] and loaded.options == {"timeout_s": 3.5}
    public = PolicyPublic.model_validate(loaded)
    assert public.created_at.tzinfo is not None  # SQLite hands back naive UTC; Public makes it aware
    assert session.get(ModelRow, model.id).config["model"] == "openai/gpt-4o-mini"


def test_policy_names_are_unique(session):
    session.add(PolicyRow(name="dup-policy", type="fixed", models=["a"]))
    session.commit()
    session.add(PolicyRow(name="dup-policy", type="fixed", models=["b"]))
    with pytest.raises(IntegrityError):
        session.commit()
    session.rollback()


def test_request_log_foreign_key_is_enforced(session):
    """SQLite enforces foreign keys only with PRAGMA foreign_keys=ON, which every connection sets."""
    session.add(RequestLog.from_create(RequestLogCreate(api_key_id=987_654, status="ok")))
    with pytest.raises(IntegrityError):
        session.commit()
    session.rollback()


def test_request_log_metadata_uses_the_openai_name(session):
    entry = RequestLogCreate.model_validate({"status": "ok", "metadata": {"team": "search"}})
    session.add(RequestLog.from_create(entry))
    session.commit()
    stored = session.connection().execute(text("SELECT metadata FROM request_log WHERE id = :id"), {"id": entry.id}).scalar()
    assert "search" in str(stored)
