"""evals.sandbox: each way a program can end, and that the parent process is left alone."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from evals.sandbox import STDERR_TAIL, network_isolation, run_python


def test_passing_and_failing_programs():
    ok = run_python("def f(x):\n    return x + 1\nassert f(1) == 2\n", timeout_s=10)
    assert (ok.passed, ok.status, ok.returncode) == (True, "passed", 0)
    wrong = run_python("def f(x):\n    return x\nassert f(1) == 2, 'f is wrong'\n", timeout_s=10)
    assert (wrong.passed, wrong.status, wrong.returncode) == (False, "failed", 1)
    assert "AssertionError: f is wrong" in wrong.stderr
    syntax = run_python("def f(:\n", timeout_s=10)
    assert syntax.status == "failed" and "SyntaxError" in syntax.stderr


def test_infinite_loop_times_out():
    start = time.monotonic()
    result = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed
    assert time.monotonic() - start < 5


def test_timeout_kills_the_programs_children():
    marker = "987.654321"  # an unusual argument to find the child by
    program = f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\nwhile True:\n    pass\n"
    assert run_python(program, timeout_s=1.0).status == "timeout"
    time.sleep(0.2)
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                left.append(proc.name)
        except OSError:
            pass
    assert left == []


def test_no_network():
    program = ("import socket\n"
               "try:\n"
               "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
               "except OSError as exc:\n"
               "    raise SystemExit(f'blocked: {exc}')\n")
    result = run_python(program, timeout_s=10)
    assert result.status == "failed" and "blocked" in result.stderr
    assert network_isolation() in ("unshare", "socket-prelude")


def test_memory_bomb_fails_cleanly_and_parent_is_unaffected():
    limits_before = resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU)
    cwd_before = os.getcwd()
    result = run_python("blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 2**20))\n",
                        timeout_s=20, memory_mb=256)
    assert result.status == "failed" and "MemoryError" in result.stderr
    assert (resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU)) == limits_before
    assert os.getcwd() == cwd_before
    big = bytearray(300 * 2**20)  # the parent can still allocate more than the child's limit
    assert len(big) == 300 * 2**20
    del big


def test_fresh_directory_and_minimal_environment(monkeypatch):
    monkeypatch.setenv("LINK_SANDBOX_SECRET", "do-not-leak")
    program = ("import os, sys\n"
               "assert os.listdir('.') == ['main.py'], os.listdir('.')\n"
               "assert 'LINK_SANDBOX_SECRET' not in os.environ, 'environment leaked'\n"
               "assert sys.flags.isolated == 1\n"
               "open('left_behind.txt', 'w').write('x')\n")
    first = run_python(program, timeout_s=10)
    assert first.passed, first.stderr
    assert run_python(program, timeout_s=10).passed  # the file written by the first run is gone


def test_file_size_limit():
    result = run_python("open('big', 'wb').write(b'x' * (64 * 2**20))\n", timeout_s=10)
    assert result.status == "failed" and "File too large" in result.stderr


def test_stderr_is_a_tail():
    result = run_python("import sys\nsys.stderr.write('x' * 100000 + 'END')\nraise SystemExit(3)\n", timeout_s=10)
    assert result.returncode == 3 and result.status == "failed"
    assert result.stderr.endswith("END") and len(result.stderr) == STDERR_TAIL


def test_bad_limits():
    with pytest.raises(ValueError):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError):
        run_python("pass", memory_mb=0)
