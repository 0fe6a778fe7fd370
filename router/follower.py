"""Following one worker's cache events into the prefix index, without ever trusting a gap.

Every event on a worker's stream carries a sequence number (1, 2, 3, ... per
worker) and the engine's incarnation (drawn at each engine start). The
follower applies events in order and, when the history it holds cannot be
continued, rebuilds that worker's part of the index from a snapshot
(``ListBlocks``: every block the worker serves, and the sequence the
snapshot includes):

- a **gap** (the next sequence is not the last one plus one), or the engine
  saying RESYNC (its replay buffer no longer reaches back): snapshot;
- a **new incarnation** (the engine restarted) or a sequence going
  **backwards**: the worker's entries are dropped first, then snapshot;
- a **CLEARED** event: the worker's entries are dropped;
- the stream breaks: reconnect from the last sequence (the engine replays
  what was missed); a worker unreachable for ``forget_after_s`` is dropped
  from the index until it answers again.

These are the complaints users of the peers' routers have (stale entries
after restarts, ignored clears, silent gaps: docs/peers.md); each case is
counted (``counts``) and exported as a metric.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from vertumnus._proto import worker_pb2

__all__ = ["Follower", "FollowerCounts"]

_log = logging.getLogger("vertumnus.router.follower")

Apply = Callable[[int, Sequence[tuple[int, int, int | None]], Sequence[int], bool], None]
"""``apply(worker, stored, removed, cleared)``: fold one batch into the index."""


@dataclass
class FollowerCounts:
    events: int = 0
    gaps: int = 0
    resyncs: int = 0
    drops: int = 0
    """Times the worker's entries were dropped (restart, sequence backwards, clear, gone)."""
    reconnects: int = 0


@dataclass
class Follower:
    """One worker's event stream, applied to the index through ``apply``."""

    worker: int
    stub: object
    """The worker's ``WorkerStub``."""
    apply: Apply
    epoch: int = 0
    """The epoch the worker was created in (the engine checks it: a reused id is RESYNC)."""
    sequence: int = 0
    """The last sequence applied (0: none yet)."""
    incarnation: int = 0
    """The engine incarnation the history comes from (0: unknown)."""
    resync_first: bool = True
    """Start with a snapshot (a router that starts, or a worker it never saw);
    False for a worker the router has just created in a switch, whose index entries
    the reconciliation plan set and whose stream starts at 1."""
    retry_s: float = 0.5
    forget_after_s: float = 10.0
    on_unreachable: Callable[[int, bool], None] | None = None
    """``fn(worker, unreachable)`` when the worker stops or starts answering."""
    counts: FollowerCounts = field(default_factory=FollowerCounts)
    _task: asyncio.Task[None] | None = None
    _synced: asyncio.Event = field(default_factory=asyncio.Event)
    _down_since: float | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"follow-{self.worker}"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def synced(self, timeout_s: float) -> bool:
        """Wait until the worker's part of the index reflects a snapshot or its stream."""
        try:
            await asyncio.wait_for(self._synced.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _reached(self) -> None:
        """The worker answered: if it was unreachable, it is back."""
        if self._down_since is not None:
            self._down_since = None
            if self.on_unreachable is not None:
                self.on_unreachable(self.worker, False)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        need_snapshot = self.resync_first
        forgotten = False
        while True:
            try:
                if need_snapshot:
                    await self._snapshot()
                    need_snapshot = False
                if not self.resync_first or self.sequence or self.incarnation:
                    self._synced.set()
                need_snapshot = await self._stream()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION and self._down_since is None:
                    # The endpoint leads no such worker any more (a regroup the router
                    # has not committed yet, or a foreign one), or the worker failed
                    # (an SGLang server that exited): said once per streak.
                    _log.info("worker %d: %s", self.worker, e.details())
                now = loop.time()
                if self._down_since is None:
                    self._down_since = now
                    self.counts.reconnects += 1
                    if self.on_unreachable is not None:
                        self.on_unreachable(self.worker, True)
                if not forgotten and now - self._down_since >= self.forget_after_s:
                    # Its cache is gone or stale: stop advertising it. It
                    # comes back with a fresh snapshot when it answers.
                    self.apply(self.worker, (), (), True)
                    self.counts.drops += 1
                    forgotten = True
                    need_snapshot = True
                    self.sequence = 0
                await asyncio.sleep(self.retry_s)
                continue
            forgotten = False

    async def _snapshot(self) -> None:
        snap = await self.stub.ListBlocks(worker_pb2.ListBlocksRequest(), timeout=30.0)  # type: ignore[attr-defined]
        self._reached()
        stored = [(b.key, b.position, b.parent if b.position else None) for b in snap.served]
        if self.incarnation and snap.incarnation != self.incarnation:
            self.counts.drops += 1  # the engine restarted: what we had of it goes
        self.apply(self.worker, stored, (), True)
        self.sequence = snap.sequence
        self.incarnation = snap.incarnation
        self.epoch = max(self.epoch, snap.epoch)
        self.counts.resyncs += 1
        self._synced.set()

    async def _stream(self) -> bool:
        """Apply events until the stream ends or the history breaks; True if a
        snapshot is needed."""
        request = worker_pb2.StreamCacheEventsRequest(
            from_sequence=self.sequence, incarnation=self.incarnation, epoch=self.epoch
        )
        call = self.stub.StreamCacheEvents(request)  # type: ignore[attr-defined]
        try:
            await call.wait_for_connection()
            self._reached()
            async for ev in call:
                self.counts.events += 1
                if ev.kind == worker_pb2.CacheEvent.RESYNC:
                    self.counts.gaps += 1
                    return True
                if self.incarnation and ev.incarnation != self.incarnation:
                    # The engine restarted: everything we knew of it is stale.
                    self.apply(self.worker, (), (), True)
                    self.counts.drops += 1
                    self.incarnation = ev.incarnation
                    self.sequence = 0
                    return True
                if ev.sequence <= self.sequence:
                    # Backwards (the engine only sends what follows our sequence):
                    # a history we do not know. Drop what we have, then snapshot.
                    self.apply(self.worker, (), (), True)
                    self.counts.drops += 1
                    self.sequence = 0
                    return True
                if ev.sequence != self.sequence + 1:
                    self.counts.gaps += 1
                    return True
                self.incarnation = ev.incarnation
                self._apply_event(ev)
                self.sequence = ev.sequence
                self._synced.set()
        finally:
            call.cancel()
        return False  # the stream ended (the engine shut it): reconnect from here

    def _apply_event(self, ev: worker_pb2.CacheEvent) -> None:
        kind = ev.kind
        if kind == worker_pb2.CacheEvent.STORED:
            stored = [
                (k, p, parent if p else None)
                for k, p, parent in zip(
                    ev.block_keys,
                    ev.positions,
                    ev.parent_keys or [0] * len(ev.block_keys),
                    strict=True,
                )
            ]
            self.apply(self.worker, stored, (), False)
        elif kind == worker_pb2.CacheEvent.REMOVED:
            self.apply(self.worker, (), list(ev.block_keys), False)
        elif kind == worker_pb2.CacheEvent.CLEARED:
            self.apply(self.worker, (), (), True)
            self.counts.drops += 1
