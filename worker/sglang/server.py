"""One SGLang server process of the adapter: start it, watch it, stop it.

:class:`ServerProcess` runs the exact command :mod:`.command` builds for one CP worker
(``python3 -m sglang.launch_server ...`` with ``CUDA_VISIBLE_DEVICES``), or the same
flags after another *launcher* (tests put a stand-in server there). It

- starts the server in a process session of its own, so that stopping it reaches the
  scheduler and TP processes SGLang forks (a signal to the whole group);
- keeps the last lines the server wrote (stdout and stderr, merged), forwarding
  each line, prefixed with the worker it belongs to, to a log (the adapter's stderr
  in a pod, so ``kubectl logs`` shows every server);
- waits for ``GET /health`` to answer 200 (503 while SGLang loads, warms up, or when
  its scheduler stops answering: ``sglang/srt/entrypoints/http_server.py``,
  ``health_generate``), failing early, with the exit code and those last lines, if
  the process ends first;
- reports an exit it did not ask for through ``on_exit`` (once) and restarts
  nothing: the adapter marks the worker failed and says why;
- stops it with SIGTERM to the group, then SIGKILL after ``timeout_s``.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from ..errors import NotReady
from .command import ServerCommand

__all__ = ["ServerDown", "ServerExit", "ServerProcess", "launch_argv"]

_MODULE_ARGV = ("-m", "sglang.launch_server")


class ServerDown(NotReady):
    """The worker's SGLang server is not running (it exited, or never became healthy)."""


@dataclass(frozen=True)
class ServerExit:
    """How a server process ended."""

    pid: int
    code: int  # negative: killed by that signal (subprocess's convention)
    tail: tuple[str, ...]  # its last lines of output
    requested: bool  # the adapter stopped it

    def describe(self) -> str:
        how = f"killed by signal {-self.code}" if self.code < 0 else f"exited with code {self.code}"
        last = " | ".join(self.tail[-8:]) if self.tail else "(no output)"
        return f"its SGLang server (pid {self.pid}) {how}; last output: {last}"


def launch_argv(command: ServerCommand, launcher: Sequence[str] | None = None) -> list[str]:
    """The argv to run: the command's own, or its SGLang flags after ``launcher``
    (e.g. ``[sys.executable, "tests/worker/sglang_standin.py"]``)."""
    argv = list(command.argv)
    if launcher is None:
        return argv
    if tuple(argv[1:3]) != _MODULE_ARGV:
        raise ValueError(f"not an SGLang server command: {argv[:3]}")
    return [*launcher, *argv[3:]]


class ServerProcess:
    """The process of one SGLang server (see the module docstring). Thread-safe."""

    def __init__(
        self,
        command: ServerCommand,
        name: str,
        *,
        launcher: Sequence[str] | None = None,
        on_exit: Callable[[ServerExit], None] | None = None,
        log: IO[str] | None = None,
        tail_lines: int = 40,
    ) -> None:
        self.command, self.name = command, name
        self.argv = launch_argv(command, launcher)
        self.health_url = f"http://127.0.0.1:{command.ports['http']}/health"
        self._on_exit = on_exit
        self._log = log
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._stopping = False
        self._reader: threading.Thread | None = None
        self._exited = threading.Event()
        self.exit: ServerExit | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and not self._exited.is_set()

    def tail(self) -> list[str]:
        with self._lock:
            return list(self._tail)

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError(f"{self.name}: started already")
        env = {**os.environ, **self.command.env}
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,  # its own group: stop() signals SGLang's children too
            )
        except OSError as exc:
            raise ServerDown(f"{self.name}: cannot run {self.argv[0]!r}: {exc.strerror}") from None
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-out", daemon=True)
        self._reader.start()
        threading.Thread(target=self._watch, name=f"{self.name}-wait", daemon=True).start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            line = line.rstrip("\n")
            with self._lock:
                self._tail.append(line)
            if self._log is not None:
                with contextlib.suppress(ValueError, OSError):  # the log closed under us
                    print(f"[{self.name}] {line}", file=self._log, flush=True)

    def _watch(self) -> None:
        assert self._proc is not None
        code = self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)  # the last lines explain the exit
        with self._lock:
            requested = self._stopping
            self.exit = ServerExit(self._proc.pid, code, tuple(self._tail), requested)
        self._exited.set()
        if not requested and self._on_exit is not None:
            self._on_exit(self.exit)

    def wait_exit(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to end; whether it has."""
        return self._exited.wait(timeout_s)

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.1) -> float:
        """Wait until ``/health`` answers 200; the seconds since :meth:`start`.

        Raises :class:`ServerDown` naming the exit code and the last output if the
        process ends first, or the last answer if ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            if self._exited.wait(0):
                assert self.exit is not None
                raise ServerDown(f"{self.name}: {self.exit.describe()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerDown(
                    f"{self.name}: not healthy within {timeout_s:.0f} s ({self.health_url}: {last}); "
                    f"last output: {' | '.join(self.tail()[-8:]) or '(none)'}"
                )
            try:
                # SGLang's /health itself waits up to 20 s for its scheduler (http_server.py).
                with urllib.request.urlopen(self.health_url, timeout=min(25.0, remaining)) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started_at
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (OSError, ValueError) as e:  # not listening yet, reset, timed out
                last = str(getattr(e, "reason", e))
            self._exited.wait(poll_s)

    def stop(self, timeout_s: float = 30.0) -> float:
        """SIGTERM to the server's process group, SIGKILL after ``timeout_s``; the
        seconds it took (0 if it was not running)."""
        proc = self._proc
        if proc is None:
            return 0.0
        with self._lock:
            self._stopping = not self._exited.is_set()
        started = time.monotonic()
        if self._exited.is_set():
            return 0.0
        self._signal(signal.SIGTERM)
        if not self._exited.wait(timeout_s):
            self._signal(signal.SIGKILL)
            self._exited.wait(10)
        # SGLang's children may outlive the process we started (e.g. a hung TP worker);
        # the group is still ours right after its leader ended.
        self._signal(signal.SIGKILL)
        return time.monotonic() - started

    def _signal(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)
