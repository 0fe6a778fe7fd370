"""A real ``redis-server`` for tests: started on a free loopback port in a temporary folder.

The Redis tests run against the real server (Debian's ``redis-server``
package in CI), never a fake: the Lua scripts, streams and ACLs are what is
under test. :func:`redis_server_binary` finds it, or fails the test with a
message naming the package — unless ``VERTUMNUS_SKIP_REDIS=1`` is set, which
skips the Redis tests instead. ``VERTUMNUS_REDIS_SERVER`` may name another
binary.

:class:`RedisServer` writes a config file (no persistence, loopback only;
passwords and ACL users go in the file, not on the command line), waits for
``PING``, and can be killed and started again on the same port (the restart
tests). The fixtures that use it are in ``tests/store/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

SKIP_ENV = "VERTUMNUS_SKIP_REDIS"
BINARY_ENV = "VERTUMNUS_REDIS_SERVER"


def redis_server_binary() -> str:
    """The ``redis-server`` to run; skips (``VERTUMNUS_SKIP_REDIS=1``) or fails the test if none."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: the tests against a real redis-server are skipped")
    binary = os.environ.get(BINARY_ENV) or shutil.which("redis-server")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(
            "redis-server not found"
            + (
                f" at {BINARY_ENV}={os.environ[BINARY_ENV]!r}"
                if os.environ.get(BINARY_ENV)
                else " on PATH"
            )
            + ": the Redis store is tested against a real server. Install Debian's package "
            "(apt-get install redis-server), or set VERTUMNUS_SKIP_REDIS=1 to skip these tests.",
            pytrace=False,
        )
    return binary


def with_parent_death(cmd: list[str]) -> list[str]:
    """``cmd`` run so that it gets SIGKILL when the process that started it dies (Linux,
    util-linux ``setpriv``), so a killed test run leaves no redis-server behind. No
    ``preexec_fn``: Python code in a child forked from a process with gRPC threads can
    crash it (seen: SIGSEGV). The signal follows the *thread* that started the child:
    start it from one that outlives it (not a to_thread worker)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *cmd] if setpriv else cmd


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process of the tests' own (start, kill, start again)."""

    def __init__(
        self, workdir: Path, *, config: Sequence[str] = (), password: str | None = None
    ) -> None:
        """``config``: extra lines of redis.conf (``user alice on >pw ~vt:* +@all``).
        ``password``: the default user's password (``requirepass``), used by :meth:`client`."""
        self.binary = redis_server_binary()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.password = password
        self._config = list(config) + ([f"requirepass {password}"] if password else [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _write_config(self) -> Path:
        path = self.workdir / "redis.conf"
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            'save ""',
            "appendonly no",
            f"dir {self.workdir}",
            "daemonize no",
            "loglevel warning",
            *self._config,
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 10.0) -> RedisServer:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = self.workdir / "redis.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                with_parent_death([self.binary, str(self._write_config())]),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        probe = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_connect_timeout=0.2,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self.proc.returncode} on port {self.port}: "
                        + log.read_text(errors="replace")[-2000:]
                    )
                try:
                    if probe.ping():
                        return self
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"redis-server on port {self.port} did not answer PING in {timeout} s"
                    )
                time.sleep(0.02)
        finally:
            probe.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would (nothing is saved: there is no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, **options: Any) -> redis.Redis:
        """A client the way the router builds one (short timeouts, one immediate retry)."""
        from vertumnus.router.redis_conn import redis_client

        env = {"VERTUMNUS_REDIS_PASSWORD": self.password} if self.password else {}
        return redis_client(self.url, environ=env, **options)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
