"""How long Python's cyclic garbage collector stops a serving process: every collection, timed.

A collection runs on whichever thread allocated when a generation filled up,
and everything on that thread waits for it: in a router, every decision queued
behind it. The router keeps its prefix index and its start-up heap out of the
collector's walks (``vertumnus.core.trie.UNTRACKED``, :mod:`vertumnus.gcfreeze`);
:class:`CollectorPauses` is how a deployment sees that it worked: the router
exports each pause as ``vertumnus_process_gc_pause_seconds{generation}``.

The callback (``gc.callbacks``) only appends to a bounded deque, which is safe
from any thread and takes no lock a metrics exporter could hold; the owner
drains it from its own loop.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["CollectorPauses"]


class CollectorPauses:
    """Times every collection of this process while started: (generation, seconds) each.

    ``keep`` bounds what waits to be drained (the oldest go first): a process
    that is never drained loses figures, not memory.
    """

    def __init__(self, keep: int = 10_000, clock: Callable[[], float] = time.perf_counter) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._done: deque[tuple[int, float]] = deque(maxlen=keep)
        self._clock = clock
        self._began = 0.0
        self._started = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = self._clock()
        else:
            self._done.append((info["generation"], self._clock() - self._began))

    def start(self) -> None:
        """Time the process's collections from now on (idempotent)."""
        if not self._started:
            gc.callbacks.append(self._callback)
            self._started = True

    def stop(self) -> None:
        """Stop timing (idempotent); what was timed can still be drained."""
        if self._started:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._callback)
            self._started = False

    def drain(self) -> list[tuple[int, float]]:
        """The collections timed since the last drain, oldest first: (generation, seconds)."""
        out = []
        done = self._done
        while done:
            out.append(done.popleft())
        return out
