"""Run untrusted Python (generated code plus its unit tests) in a limited subprocess.

    result = run_python(program, timeout_s=10.0, memory_mb=1024)
    result.passed, result.status, result.stderr      # True, "passed", ""

What is enforced, per run:

- a fresh temporary directory as the working directory (deleted afterwards), `python -I` (isolated
  mode: no PYTHON* variables, no user site, no script directory on sys.path) and a minimal environment
  (PATH, LANG, HOME = the temp dir);
- resource limits set in the child before the program starts: RLIMIT_AS = `memory_mb` (address space;
  a memory bomb gets MemoryError), RLIMIT_CPU = ceil(timeout_s) + 1 s (SIGXCPU; hard limit 1 s later),
  RLIMIT_FSIZE = 16 MiB per file written (stdout/stderr included), RLIMIT_CORE = 0. RLIMIT_NPROC is
  not set: Linux counts it over all of the user's processes (and ignores it for root), so a limit low
  enough to matter would also fail the sandbox on a busy machine; instead the wall-clock timeout kills
  the whole process group, children included;
- a wall-clock timeout (`timeout_s`), after which the process group is killed (status "timeout");
- no network: `unshare -rn` (a new user and network namespace, with only a downed loopback) when it
  works on this machine, detected once per process (`network_isolation()`); otherwise a prelude that
  replaces `socket.socket`, `socket.create_connection` and `socket.socketpair` with functions raising
  OSError, which stops ordinary library code but not a program that imports `_socket` on purpose.

The limits are set by a small bootstrap (`python -I -c ...`) that calls `setrlimit` and then `exec`s
the program's interpreter, rather than by `preexec_fn`, which Python documents as unsafe in a
process with threads (the runner grades from a thread pool). Like the HumanEval paper's harness
(Chen et al. 2021, "Evaluating Large Language Models Trained on Code"), this is a guard against
accidents, not a security boundary: the program runs as the calling user (the namespace maps its
root to the caller), so it can touch whatever files that user can. Run adversarial code in a container.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["passed", "failed", "timeout", "error"]
FILE_SIZE_LIMIT = 16 * 2**20  # bytes per file the program writes
STDERR_TAIL = 2000  # characters of stderr kept in the result

_NO_SOCKETS = """\
import socket as _sandbox_socket
def _sandbox_no_network(*args, **kwargs):
    raise OSError("network access is disabled in the sandbox")
_sandbox_socket.socket = _sandbox_socket.create_connection = _sandbox_socket.socketpair = _sandbox_no_network
del _sandbox_socket, _sandbox_no_network
"""

# argv: memory bytes, cpu seconds, file bytes, then the interpreter and its arguments to exec.
_BOOTSTRAP = """\
import os, resource, sys
mem, cpu, fsize = (int(v) for v in sys.argv[1:4])
for limit, soft, hard in ((resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_CPU, cpu, cpu + 1),
                          (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_CORE, 0, 0)):
    resource.setrlimit(limit, (soft, hard))
os.execv(sys.argv[4], sys.argv[4:])
"""


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one sandboxed run.

    Attributes:
        passed: the program exited with status 0.
        status: "passed"; "failed" (non-zero exit: assertion, exception, MemoryError, syntax error);
            "timeout" (wall-clock or CPU limit); "error" (killed by another signal, or could not start).
        stderr: the last `STDERR_TAIL` characters of the program's stderr (or the start-up error).
        returncode: the exit status (negative: killed by that signal); None when it did not start.
    """

    passed: bool
    status: Status
    stderr: str = ""
    returncode: int | None = None


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """How this machine's sandbox cuts the network: "unshare" (user + network namespace) or "socket-prelude"."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "socket-prelude"
    try:
        probe = subprocess.run([unshare, "-rn", sys.executable, "-I", "-c", "pass"],
                               capture_output=True, timeout=20, env=_minimal_env(tempfile.gettempdir()))
    except (OSError, subprocess.TimeoutExpired):
        return "socket-prelude"
    return "unshare" if probe.returncode == 0 else "socket-prelude"


def _minimal_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home}


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 4 * STDERR_TAIL))
        return f.read().decode("utf-8", "replace")[-STDERR_TAIL:]


def run_python(program: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> SandboxResult:
    """Run `program` (Python source) in a fresh sandboxed interpreter and report how it ended.

    Args:
        program: the whole program; it passes when it exits with status 0.
        timeout_s: wall-clock seconds before the process group is killed (> 0).
        memory_mb: address-space limit in MiB (the interpreter itself needs about 30 MiB).
    Returns:
        SandboxResult; never raises for anything the program does.
    Raises:
        ValueError: a non-positive timeout_s or memory_mb.
    """
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout_s and memory_mb must be > 0, got {timeout_s} and {memory_mb}")
    isolation = network_isolation()
    with tempfile.TemporaryDirectory(prefix="link-sandbox-") as tmp:
        work = Path(tmp) / "work"  # the program's directory; its output files live beside it
        work.mkdir()
        source = program if isolation == "unshare" else _NO_SOCKETS + program
        (work / "main.py").write_text(source, encoding="utf-8")
        limits = [str(memory_mb * 2**20), str(math.ceil(timeout_s) + 1), str(FILE_SIZE_LIMIT)]
        argv = [sys.executable, "-I", "-c", _BOOTSTRAP, *limits, sys.executable, "-I", "main.py"]
        if isolation == "unshare":
            argv = [shutil.which("unshare") or "unshare", "-rn", *argv]
        with open(Path(tmp) / "stdout", "wb") as out, open(Path(tmp) / "stderr", "wb") as err:
            try:
                proc = subprocess.Popen(argv, cwd=work, env=_minimal_env(str(work)), stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True)
            except OSError as exc:
                return SandboxResult(False, "error", f"could not start the sandbox: {exc}")
            try:
                code = proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        stderr = _tail(Path(tmp) / "stderr")
    if timed_out:
        return SandboxResult(False, "timeout", stderr, proc.returncode)
    if code == 0:
        return SandboxResult(True, "passed", stderr, 0)
    if code == -signal.SIGXCPU:  # the soft CPU limit (a busy loop on several threads outruns the wall clock)
        return SandboxResult(False, "timeout", stderr, code)
    return SandboxResult(False, "failed" if code > 0 else "error", stderr, code)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill what is left of the program's process group (children it spawned included) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
