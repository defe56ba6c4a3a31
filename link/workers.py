"""`link serve --workers N`: N gateway processes on one port (a pre-fork over one shared listening socket).

    sock = bind_listener("127.0.0.1", 8000)                 # the parent binds once; OSError when it cannot
    status = serve_gateway_workers(sock, settings, config, log_level="info")   # exit status: 0 after a clean stop
    status = serve_workers(sock, 2, worker)                  # the same for any worker(index) -> exit status

Why a pre-fork of our own rather than uvicorn's `--workers`: uvicorn's workers are identical copies built from an
import string, while each of ours needs its own settings (its `LINK_INSTANCE_ID`, the budget ledger's owner id:
link/budget_leases.py) and the SIGTERM drain of protocol/drain.py.

1. The parent binds the port once (SO_REUSEADDR, backlog 2048) and forks N children; each child inherits the
   listening socket and runs its own event loop, app, database pool, request-log writer and budget-ledger lease.
   The kernel hands each new connection to one of the processes that wait in `accept` on the socket.
2. SIGTERM (or SIGINT) to the parent is forwarded as SIGTERM to every child; each drains (protocol/drain.py:
   `/health` 503, requests in flight finish within LINK_DRAIN_TIMEOUT_S, the request log is flushed) and exits 0;
   the parent then exits 0 (non-zero when a child did not).
3. A child that dies while the gateway is serving (a crash, the OOM killer) is started again under the same index,
   so under the same instance id: its start-up releases the budget holds its predecessor left (rule 3 of
   link/budget_leases.py). A child that fails its start-up (status 3: the database unreachable, a lifespan error)
   stops the whole gateway with that status, rather than restarting in a loop.
4. Each child asks the kernel for SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG), so a `kill -9` of the
   parent alone still drains the children instead of leaving them serving.

The parent starts no thread and opens no connection before it forks (`link serve` disposes of the engines it
used to check the config), so nothing is copied half-locked into the children.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from types import FrameType

import uvicorn

from link.config import LinkConfig
from link.settings import Settings
from protocol.coalesce import coalescing_protocol
from protocol.drain import GRACE_S, DrainingServer

logger = logging.getLogger(__name__)

BACKLOG = 2048
STARTUP_FAILURE = 3           # uvicorn's exit status for a server that did not start
RESTART_DELAY_S = 1.0         # wait before starting a crashed worker again
PR_SET_PDEATHSIG = 1          # prctl(2) option: the signal this process gets when its parent dies


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on `host:port` (TCP, SO_REUSEADDR) for the workers to share; inheritable.

    Raises:
        socket.gaierror: `host` does not resolve. OSError: the port is in use or cannot be bound.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def worker_instance_id(base: str | None, index: int) -> str | None:
    """The `LINK_INSTANCE_ID` of worker `index` (0-based): "<base>-w<index>"; None (a fresh id per process, its
    holds released once its lease expires) when no base id is set."""
    return None if base is None else f"{base}-w{index}"


def serve_gateway_workers(sock: socket.socket, settings: Settings, config: LinkConfig, *,
                          log_level: str = "info") -> int:
    """Serve the gateway with `settings.workers` processes on `sock` until SIGTERM or SIGINT (`serve_workers`).
    Worker i runs `create_app` with `instance_id` "<LINK_INSTANCE_ID>-w<i>" (`worker_instance_id`) and drains on
    SIGTERM for at most `settings.drain_timeout_s` seconds. Returns the parent's exit status."""

    def run_gateway(index: int) -> int:
        from link.app import create_app

        own = settings.model_copy(update={"instance_id": worker_instance_id(settings.instance_id, index)})
        app = create_app(own, config)
        server = DrainingServer(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=GRACE_S,
                                               http=coalescing_protocol()),
                                app.state.drain, settings.drain_timeout_s)
        server.run(sockets=[sock])
        return 0 if server.started else STARTUP_FAILURE

    if any(d.kind == "local" for d in config.models):
        logger.warning("%d gateway workers each load their own copy of the local models; serve a local model with "
                       "`link engine serve` and list it as an openai deployment to load it once", settings.workers)
    return serve_workers(sock, settings.workers, run_gateway)


def serve_workers(sock: socket.socket, num_workers: int, worker: Callable[[int], int], *,
                  restart_delay_s: float = RESTART_DELAY_S) -> int:
    """Run `num_workers` forked children, each calling `worker(index)` (which serves on `sock` until a signal and
    returns its exit status), until SIGTERM or SIGINT; see the module docstring.

    Args:
        sock: the listening socket (`bind_listener`), shared by every worker.
        num_workers: processes (>= 1).
        worker: runs in the child; its return value is the child's exit status (an exception: status 1).
        restart_delay_s: seconds before a crashed worker is started again.
    Returns:
        The parent's exit status: 0 when every worker exited 0 after the shutdown signal, else the first non-zero
        status (STARTUP_FAILURE when a worker failed its start-up).
    Raises:
        ValueError: `num_workers` < 1.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    parent_pid = os.getpid()
    children: dict[int, int] = {}  # pid -> worker index
    stopping = False
    status = 0

    def forward(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if os.getpid() != parent_pid:  # a child between fork and its own handlers: not ours to forward
            return
        if not stopping:
            logger.info("%s: stopping %d worker(s)", signal.Signals(sig).name, len(children))
        stopping = True
        for pid in list(children):
            _signal(pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index in range(num_workers):
            children[_spawn(sock, index, worker, parent_pid)] = index
        while children:
            try:
                pid, wait_status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            index = children.pop(pid, None)
            if index is None:
                continue
            code = os.waitstatus_to_exitcode(wait_status)
            if stopping:
                status = status or code
                continue
            if code == STARTUP_FAILURE:
                logger.error("gateway worker %d (pid %d) failed to start; stopping the other workers", index, pid)
                status, stopping = code, True
                for other in list(children):
                    _signal(other, signal.SIGTERM)
                continue
            logger.error("gateway worker %d (pid %d) exited with status %d; starting it again in %.0f s",
                         index, pid, code, restart_delay_s)
            time.sleep(restart_delay_s)
            if not stopping:
                children[_spawn(sock, index, worker, parent_pid)] = index
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return status


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _spawn(sock: socket.socket, index: int, worker: Callable[[int], int], parent_pid: int) -> int:
    """Fork one worker; returns its pid in the parent and never returns in the child."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _die_with_parent(parent_pid)
        code = worker(index)
    except SystemExit as exc:  # uvicorn exits with STARTUP_FAILURE when the lifespan fails
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:  # uvicorn re-raises a captured SIGINT after its clean shutdown
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never back into the parent's code (its CLI, its atexit hooks)


def _die_with_parent(parent_pid: int) -> None:
    """Ask for SIGTERM when the parent dies (Linux only; elsewhere a no-op), and drain at once if it already has."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died between the fork and the prctl
        os.kill(os.getpid(), signal.SIGTERM)
