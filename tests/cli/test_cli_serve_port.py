"""`link serve` and `link engine serve` on a port that another process holds: one `error:` line naming the port
and how to pick another, exit code 2, before any server starts."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from cli.app import app

runner = CliRunner()


@pytest.fixture
def busy_port():
    """A port on 127.0.0.1 with a listening socket on it (the way another server holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def test_serve_on_a_busy_port_says_how_to_pick_another(busy_port, tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_HOME", str(tmp_path))
    monkeypatch.delenv("LINK_DATABASE_URL", raising=False)
    monkeypatch.delenv("LINK_CONFIG", raising=False)
    monkeypatch.setenv("LINK_PORT", str(busy_port))
    result = runner.invoke(app, ["serve", "--host", "127.0.0.1"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (f"error: port {busy_port} on 127.0.0.1 is in use (another `link serve`?); "
                                     "pick another with --port N or LINK_PORT=N")


def test_engine_serve_on_a_busy_port_says_how_to_pick_another(busy_port):
    result = runner.invoke(app, ["engine", "serve", "--port", str(busy_port)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (f"error: port {busy_port} on 127.0.0.1 is in use (another `link engine serve`?); "
                                     "pick another with --port N")


def test_serve_on_a_free_port_passes_the_check(tmp_path):
    from cli.serve import check_port

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    check_port("127.0.0.1", free, command="link serve", hint="--port N")  # no exit: the port is free


def test_the_servers_show_our_packages_info_lines_on_stderr(capsys):
    import logging

    from cli.serve import OUR_LOGGERS, show_our_logs

    before = {name: logging.getLogger(name).level for name in OUR_LOGGERS}
    handler = show_our_logs("info")
    try:
        logging.getLogger("serving.model_loader").info("loading smollm2 (98 MB)")
        logging.getLogger("link.readiness").debug("not shown at info")
        logging.getLogger("link.readiness").warning("model x: OPENAI_API_KEY is not set")
    finally:
        for name, level in before.items():
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).setLevel(level)
    err = capsys.readouterr().err.splitlines()
    assert err == ["INFO     serving.model_loader: loading smollm2 (98 MB)",
                   "WARNING  link.readiness: model x: OPENAI_API_KEY is not set"]
