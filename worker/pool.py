"""The host side of a pool of rank processes: spawn them, send them commands.

The pool starts N rank processes (:mod:`vertumnus.worker.rank`) on one
machine and talks to each through a pair of multiprocessing queues. A command
for several ranks is enqueued to all of them under one lock, so every rank
sees multi-rank commands in the same global order; that is what keeps two
concurrent commands (say a prefill on one worker and a copy involving
another) from waiting on each other in a cycle.

Cache events that ranks report with their results are handed to
``on_events`` (the engine folds them into worker-level events), in the
calling thread, before :meth:`RankPool.call` returns.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.context import ForkServerContext
from typing import TYPE_CHECKING, Any

from .rank import Answer, Command, RankSpec, Shutdown, rank_main

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from .kv_cache import CacheEvent


class RankError(RuntimeError):
    """A command failed on a rank; the message names the rank and the cause."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context() -> ForkServerContext:
    """A forkserver that has imported torch once: ranks start by forking it, which
    skips a multi-second torch import per rank, and forks no threads of ours."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "torch.distributed", "vertumnus.worker.rank", "vertumnus.worker.step"]
    )
    return ctx


def start_forkserver() -> None:
    """Start the ranks' forkserver now: it imports torch while the caller goes on
    (e.g. importing torch itself), instead of after it."""
    from multiprocessing import forkserver

    _context()
    forkserver.ensure_running()


class RankPool:
    def __init__(
        self,
        world: int,
        spec: RankSpec,
        *,
        on_events: Callable[[int, list[CacheEvent]], None] | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.world, self.spec = world, spec
        self.on_events = on_events or (lambda rank, events: None)
        ctx = _context()
        port = free_port()
        self._commands: list[Queue[Command | Shutdown]] = [ctx.Queue() for _ in range(world)]
        self._results: list[Queue[Answer]] = [ctx.Queue() for _ in range(world)]
        self._procs = [
            ctx.Process(
                target=rank_main,
                args=(r, world, port, spec, self._commands[r], self._results[r], os.getpid()),
                daemon=True,
                name=f"vertumnus-rank-{r}",
            )
            for r in range(world)
        ]
        self._order = threading.Lock()
        for p in self._procs:
            p.start()
        self.info: list[dict[str, int]] = []
        try:
            for r in range(world):
                self.info.append(self._await(r, start_timeout_s))
        except Exception:
            self.close()
            raise

    def call(self, commands: Mapping[int, Command], timeout_s: float = 600.0) -> dict[int, Any]:
        """Send ``{rank: command}`` to all ranks at once; wait for every answer.

        Raises :class:`RankError` naming the first failing rank after all
        answers are in (so no result is left behind in a queue).
        """
        with self._order:
            for rank, cmd in commands.items():
                self._commands[rank].put(cmd)
        answers: dict[int, Any] = {}
        errors: list[RankError] = []
        for rank in commands:
            try:
                answers[rank] = self._await(rank, timeout_s)
            except RankError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return answers

    def _await(self, rank: int, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status, payload, events, trace = self._results[rank].get(timeout=0.5)
                break
            except queue.Empty:
                if not self._procs[rank].is_alive():
                    raise RankError(
                        f"rank {rank} exited (code {self._procs[rank].exitcode})"
                    ) from None
                if time.monotonic() > deadline:
                    raise RankError(
                        f"rank {rank} did not answer within {timeout_s:.0f} s"
                    ) from None
        if events:
            self.on_events(rank, events)
        if status == "error":
            raise RankError(f"rank {rank}: {payload}\n{trace}")
        return payload

    def close(self) -> None:
        for q, p in zip(self._commands, self._procs, strict=True):
            if p.is_alive():
                q.put(Shutdown())
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
