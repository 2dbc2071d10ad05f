"""Real Redis and PostgreSQL servers, started in temporary directories: the one way the suite starts either
(the `redis_server` and `postgres_server` fixtures of tests/conftest.py; the fleet's and benchmarks' own).

Both listen on Unix sockets only (no port to collide with other test runs). PostgreSQL
refuses to run as root, so it runs as `nobody` through `setpriv`; its directory is made
traversable for that user. Anything that cannot start raises: these tests never skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PostgresServer", "RedisServer"]


def _pg_bin() -> Path:
    """The newest PostgreSQL installed the Debian way (/usr/lib/postgresql/N/bin): 15 on bookworm, 17 on trixie."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if
                   p.parts[-3].isdigit() else 0)
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up within {timeout_s:g}s")


class RedisServer:
    """A redis-server with append-only persistence (fsync always) on a Unix socket."""

    def __init__(self, root: Path, *, tcp: bool = False) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: apt-get install redis-server (.ci/run does)")
        self.exe = exe
        self.dir = root
        self.socket = root / "redis.sock"
        self.port = _free_port() if tcp else 0  # loopback TCP as well as the socket (for benchmarks)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    @property
    def tcp_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1",
             "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--dir", str(self.dir), "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--daemonize", "no", "--loglevel", "warning", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait(lambda: self._pong() or self.proc.poll() is not None, 30, "redis-server")  # type: ignore[union-attr]
        if self.proc.poll() is not None:
            log = (self.dir / "redis.log").read_text(errors="replace") if (self.dir / "redis.log").exists() else ""
            raise RuntimeError(f"redis-server exited at start ({self.proc.returncode}): {log[-2000:]}")

    def _pong(self) -> bool:
        """True once the server answers PING on its socket (the file appears before it accepts)."""
        if not self.socket.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(str(self.socket))
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.socket.unlink(missing_ok=True)


class PostgresServer:
    """A PostgreSQL cluster (the newest installed) run by `nobody`, on a Unix socket in a temporary directory."""

    def __init__(self, parent: Path | None = None, settings: dict[str, str] | None = None) -> None:
        """`parent`: where the cluster's directory goes (a tmpfs for benchmarks); `settings`: more `-c` options."""
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL binaries not found in {PG_BIN}: apt-get install postgresql")
        self.settings = dict(settings or {})
        self.root = Path(tempfile.mkdtemp(prefix="proctor-pg-", dir=parent))
        os.chmod(self.root, 0o755)
        self.data = self.root / "data"
        self.sockets = self.root / "run"
        self.sockets.mkdir()
        self.sockets.chmod(0o777)
        self._as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--reset-env"]
        if os.geteuid() != 0:
            self._as_user = []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.sockets}"

    def _run(self, *args: str, timeout: float = 120) -> None:
        done = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self) -> None:
        if self._as_user:
            shutil.chown(self.root, "nobody")
            shutil.chown(self.sockets, "nobody")
        if not self.data.exists():
            self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "--no-sync", "-E", "UTF8", "--locale", "C")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-l", str(self.root / "pg.log"),
                  "-o", f"-k {self.sockets} -c listen_addresses='' -c max_connections=200 -c fsync=on "
                        "-c synchronous_commit=on -c shared_buffers=32MB"
                        + "".join(f" -c {k}={v}" for k, v in self.settings.items()),
                  "start")

    def stop(self) -> None:
        if self.data.exists():
            try:
                self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
            except RuntimeError:
                pass

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
