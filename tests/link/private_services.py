"""Private PostgreSQL and Redis servers for fault tests: started on free loopback ports, stopped and restarted at will,
removed afterwards. The machine's shared servers (5432, 6379) are never touched.

    with PrivatePostgres.start(tmp_dir) as pg:      # initdb'd cluster, trust auth, fsync off
        url = pg.create_database("link")             # postgresql://postgres@127.0.0.1:P/link
        pg.stop(); pg.start_again()                  # a restart (fast shutdown: connections dropped)
    with PrivateRedis.start() as redis:              # redis-server --port P, no persistence
        redis.url                                     # redis://127.0.0.1:P/0
        redis.stop(); redis.start_again()            # same port

The binaries are looked up in /usr/lib/postgresql/*/bin (Debian's `postgresql` package; newest version first),
then on PATH; `missing_binaries()` names what is absent so a test can skip with the reason. PostgreSQL refuses
to run as root: under root the cluster runs as the `postgres` user (else `nobody`), in a folder of its own under
the system temp directory (pytest's tmp_path sits under a 0700 folder that user cannot enter).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.link.mock_launch import free_port

PG_BINARIES = ("initdb", "pg_ctl", "postgres")


def pg_bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: /usr/lib/postgresql/<newest>/bin, else PATH's; None if absent."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                      if Path(p).parent.name.isdigit() else 0, reverse=True)
    for folder in versions:
        if all((Path(folder) / name).exists() for name in PG_BINARIES):
            return Path(folder)
    found = [shutil.which(name) for name in PG_BINARIES]
    if all(found) and len({Path(p).resolve().parent for p in found}) == 1:
        return Path(found[0]).resolve().parent
    return None


def missing_binaries() -> list[str]:
    """What this machine lacks to run the private servers ([] when all is there)."""
    missing = [] if pg_bin_dir() is not None else ["PostgreSQL server binaries (initdb, pg_ctl, postgres; Debian: "
                                                   "apt-get install postgresql)"]
    if shutil.which("redis-server") is None:
        missing.append("redis-server (Debian: apt-get install redis-server)")
    return missing


def _run_as() -> pwd.struct_passwd | None:
    """The user the PostgreSQL server runs as when we are root (it refuses root); None: ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root, and no `postgres` or `nobody` user to run PostgreSQL as")


def _wait_port(port: int, timeout_s: float, process: subprocess.Popen | None = None, what: str = "server") -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s} s")


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of our own: `initdb` into `data_dir`, served by `postgres` on `port` (loopback only)."""

    data_dir: Path
    port: int
    bin_dir: Path
    user: pwd.struct_passwd | None
    process: subprocess.Popen | None = None
    databases: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, base_dir: Path | None = None, *, timeout_s: float = 60.0) -> PrivatePostgres:
        """initdb (trust auth, superuser `postgres`) and start the server on a free port.

        Args:
            base_dir: where the cluster's folder goes; None (and always under root): a new folder in the temp dir.
        Raises:
            RuntimeError: the binaries are missing or the server does not start.
        """
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL server binaries not found")
        user = _run_as()
        root = Path(tempfile.mkdtemp(prefix="link-pg-", dir=None if user or base_dir is None else base_dir))
        data_dir = root / "data"
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        server = cls(data_dir, free_port(), bin_dir, user)
        server._run([str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust",
                     "--no-sync", "-E", "UTF8", "--locale=C"], timeout_s)
        server.start_again(timeout_s)
        return server

    def _demote(self):
        if self.user is None:
            return None
        uid, gid = self.user.pw_uid, self.user.pw_gid

        def demote() -> None:
            os.setgid(gid)
            os.setuid(uid)
        return demote

    def _run(self, cmd: list[str], timeout_s: float) -> None:
        result = subprocess.run(cmd, preexec_fn=self._demote(), capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} failed ({result.returncode}): {result.stderr[-2000:]}")

    @property
    def server_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def start_again(self, timeout_s: float = 60.0) -> None:
        """Start the server (again) on the same port and data; returns once it accepts connections."""
        # fsync and synchronous commit off: a test cluster needs speed, not durability across a power loss.
        cmd = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port), "-h", "127.0.0.1",
               "-k", str(self.data_dir), "-c", "fsync=off", "-c", "synchronous_commit=off",
               "-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "shared_buffers=16MB"]
        self.process = subprocess.Popen(cmd, preexec_fn=self._demote(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        try:
            _wait_port(self.port, timeout_s, self.process, "postgres")
            self._wait_ready(timeout_s)
        except RuntimeError as exc:
            stderr = self.process.stderr.read()[-2000:] if self.process.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"{exc}: {stderr}") from None

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(f"{self.server_url}/postgres", connect_timeout=2):
                    return
            except psycopg.OperationalError:   # "the database system is starting up"
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres on port {self.port} not ready within {timeout_s} s") from None
                time.sleep(0.05)

    def create_database(self, name: str) -> str:
        """Create database `name`; returns its URL."""
        import psycopg

        with psycopg.connect(f"{self.server_url}/postgres", autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return f"{self.server_url}/{name}"

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, mode: str = "fast", timeout_s: float = 30.0) -> None:
        """Stop the server: "fast" (SIGINT: open transactions rolled back, clients disconnected, a clean shutdown)
        or "immediate" (SIGQUIT: a crash, recovered at the next start)."""
        if not self.is_running:
            return
        self.process.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def remove(self) -> None:
        """Stop the server and delete its files."""
        self.stop()
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


@dataclass
class PrivateRedis:
    """A `redis-server` of our own on a free loopback port, without persistence."""

    port: int
    process: subprocess.Popen | None = None

    @classmethod
    def start(cls, *, timeout_s: float = 30.0) -> PrivateRedis:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server not found")
        server = cls(free_port())
        server.start_again(timeout_s)
        return server

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start_again(self, timeout_s: float = 30.0) -> None:
        """Start the server (again) on the same port, empty; returns once it answers PING."""
        import redis

        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--protected-mode", "no", "--dir", tempfile.gettempdir(), "--loglevel", "warning"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_port(self.port, timeout_s, self.process, "redis-server")
        client = redis.Redis(port=self.port, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGKILL: Redis is gone at once (what the gateway sees of a crash); its data with it (no persistence)."""
        if self.is_running:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> PrivateRedis:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
