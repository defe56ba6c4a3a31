"""Fixtures of the eval tests: the data folder (skip when absent) and databases on SQLite and PostgreSQL.

No `__init__.py` here on purpose: with one, pytest would import this folder as the package `evals` and
shadow the real one. Helpers live in tests/evals/fakes.py (imported as `tests.evals.fakes`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.link.conftest import new_database_url  # noqa: F401  (fixture: a new, empty SQLite or PostgreSQL database)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """LINK_DATASETS_DIR, else ../shared/data; the test is skipped when the folder is missing."""
    path = Path(os.environ.get("LINK_DATASETS_DIR") or ROOT.parent / "shared" / "data")
    if not path.is_dir():
        pytest.skip(f"data directory {path} not found; set LINK_DATASETS_DIR")
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def eval_db_url(request, new_database_url) -> str:  # noqa: F811
    """A new database per test, on each backend (PostgreSQL skips when 127.0.0.1:5432 is unreachable)."""
    return new_database_url(request.param)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'evals.db'}"


@pytest.fixture
def link_home(tmp_path, monkeypatch) -> Path:
    """LINK_HOME and LINK_DATABASE_URL under tmp_path (run files and the cache stay out of the repository)."""
    home = tmp_path / "home"
    monkeypatch.setenv("LINK_HOME", str(home))
    monkeypatch.setenv("LINK_DATABASE_URL", f"sqlite:///{home / 'link.db'}")
    return home
