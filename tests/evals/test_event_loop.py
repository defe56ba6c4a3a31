"""Our synchronous entry points that run a coroutine (evals/event_loop.py `run_sync`: `replay`, `link eval replay`,
`link eval run`, `link route`) work inside a running event loop, where a notebook or Playwright's sync API calls them
from: `asyncio.run` alone failed there with "asyncio.run() cannot be called from a running event loop".

    .venv/bin/python -m pytest -q tests/evals/test_event_loop.py
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from typer.testing import CliRunner

from cli.app import app
from evals.event_loop import run_sync
from tests.evals import routerbench_csv as ref


async def _thread_name(value: int) -> tuple[int, str]:
    await asyncio.sleep(0)
    return value * 2, threading.current_thread().name


def test_without_a_running_loop_it_runs_here():
    assert run_sync(_thread_name(21)) == (42, threading.current_thread().name)


def test_inside_a_running_loop_it_runs_in_a_worker_thread():
    async def notebook_cell():
        return run_sync(_thread_name(21))  # synchronous call from a coroutine, as in a Jupyter cell

    value, thread = asyncio.run(notebook_cell())
    assert value == 42 and thread.startswith("run-sync") and thread != threading.current_thread().name


def test_its_errors_propagate_inside_a_running_loop():
    async def fails():
        raise KeyError("no such model")

    async def cell():
        return run_sync(fails())

    with pytest.raises(KeyError, match="no such model"):
        asyncio.run(cell())


def test_eval_replay_inside_a_running_loop_reproduces_the_recorded_accuracy(data_dir, tmp_path, monkeypatch):
    # Playwright's sync API leaves a loop running in the main thread while a browser is open: the CLI then runs
    # inside it, as here.
    monkeypatch.setenv("LINK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LINK_DATABASE_URL", f"sqlite:///{tmp_path / 'link.db'}")
    args = ["eval", "replay", "routerbench:test", "--policy", "claude-v1", "--data-dir", str(data_dir), "--json"]

    async def cell():
        return CliRunner().invoke(app, args)

    result = asyncio.run(cell())
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    n, accuracy, cost = ref.accuracy_and_cost(ref.read(data_dir, "test"), "claude-v1")
    assert data["num_prompts"] == n
    assert data["mean_score"] == pytest.approx(accuracy, abs=1e-12)
    assert data["total_cost_usd"] == pytest.approx(cost, rel=1e-12)
