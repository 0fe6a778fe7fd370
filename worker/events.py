"""Worker-level cache events: what a router can index, in order, without gaps.

A rank reports what changed in its own cache (:class:`~vertumnus.worker.kv_cache.CacheEvent`).
A router indexes **workers**, so the engine folds those into events about
what a worker serves: under partitioned storage block j of a degree-C worker
at offset o is served when its owner rank ``o + (j mod C)`` holds it
(:func:`vertumnus.worker.blocks.block_owner`). Hence (:func:`served_by`):

- a block stored on its owner rank -> the worker's ``stored`` event;
- a block dropped from its owner rank -> the worker's ``removed`` event;
- anything on a non-owner rank (a block left behind by a regroup, or evicted
  from there) changes nothing the worker serves and is not published;
- a flush of all the worker's ranks -> one ``cleared`` event.

Each worker has an :class:`EventLog`: events get ``sequence`` 1, 2, 3, ...
(one event = one kind for a batch of blocks), carry the engine's
``incarnation`` (random per engine start), and the last ``capacity`` of them
are kept for replay, so a subscriber that reconnects after a short gap asks
for the events after the last sequence it has. When the buffer no longer
reaches back that far, or the subscriber's history is not this worker's (an
older incarnation, or an id a regroup reused), the stream starts with one
``resync`` event instead: the subscriber takes a snapshot
(:meth:`vertumnus.worker.engine.Engine.list_blocks`, which reports the last
sequence it reflects) and applies the events after it.

A worker created by a regroup starts at sequence 1 with ``stored`` events for
what its ranks already serve under the new geometry, so its events from 1 on
describe it completely. When a worker leaves the grouping its log is closed:
nothing more is published for it and its subscriptions end
(:class:`WorkerGone`).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

from vertumnus.core.lattice import Slot

from .blocks import Block, block_owner
from .errors import NotReady

__all__ = ["KINDS", "EventLog", "EventStream", "WorkerEvent", "WorkerGone", "served_by"]

KINDS = ("stored", "removed", "cleared", "resync")


class WorkerGone(NotReady):
    """The worker an event stream follows left the grouping."""


@dataclass(frozen=True)
class WorkerEvent:
    """A worker-level cache event as published on the worker's stream."""

    kind: str  # one of KINDS
    block_keys: tuple[int, ...]
    positions: tuple[int, ...]
    parents: tuple[int | None, ...]  # None at position 0
    rank: int  # the owner rank it happened on; the worker's first rank for cleared/resync
    worker: int
    epoch: int
    sequence: int
    incarnation: int

    @property
    def blocks(self) -> list[Block]:
        return [Block(*b) for b in zip(self.block_keys, self.positions, self.parents, strict=True)]


def served_by(slot: Slot, rank: int, blocks: Iterable[Block]) -> list[Block]:
    """The blocks held on ``rank`` that the worker ``slot`` serves: those ``rank`` owns."""
    return [b for b in blocks if slot.offset + block_owner(b.position, slot.degree) == rank]


class _End:
    """Queued to a subscription when its worker leaves the grouping."""

    def __init__(self, message: str) -> None:
        self.message = message


class EventStream:
    """One subscription to a worker's events: the replayed ones first, then live ones."""

    def __init__(self, log: EventLog, pending: queue.Queue[WorkerEvent | _End]) -> None:
        self._log, self._queue = log, pending
        self._closed = False

    def get(self, timeout: float | None = None) -> WorkerEvent:
        """The next event; raises ``queue.Empty`` after ``timeout`` seconds without one,
        :class:`WorkerGone` once the worker has left the grouping."""
        item = self._queue.get(timeout=timeout)
        if isinstance(item, _End):
            self._queue.put(item)  # stays gone for later calls
            raise WorkerGone(item.message)
        return item

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._log._unsubscribe(self._queue)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class EventLog:
    """One worker's published events: sequence numbers, a bounded replay buffer, subscribers.

    ``created_epoch`` is the epoch whose regroup created the worker (1 for the
    engine's first grouping). Thread-safe.
    """

    def __init__(
        self, slot: Slot, incarnation: int, created_epoch: int, capacity: int = 4096
    ) -> None:
        if capacity < 1:
            raise ValueError(f"the replay buffer needs room for at least one event, got {capacity}")
        self.slot, self.incarnation, self.created_epoch = slot, incarnation, created_epoch
        self._lock = threading.Lock()
        self._buffer: deque[WorkerEvent] = deque(maxlen=capacity)
        self._subscribers: list[queue.Queue[WorkerEvent | _End]] = []
        self._last = 0
        self._end: _End | None = None

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event published (0 before the first)."""
        return self._last

    @property
    def closed(self) -> bool:
        return self._end is not None

    def publish(
        self, kind: str, blocks: Iterable[Block], rank: int, epoch: int
    ) -> WorkerEvent | None:
        """Append one event and hand it to every subscriber; None once the log is closed."""
        if kind not in KINDS[:3]:
            raise ValueError(f"cannot publish a {kind!r} event")
        bs = list(blocks)
        with self._lock:
            if self._end is not None:
                return None
            self._last += 1
            event = WorkerEvent(
                kind,
                tuple(b.key for b in bs),
                tuple(b.position for b in bs),
                tuple(b.parent for b in bs),
                rank,
                self.slot.worker,
                epoch,
                self._last,
                self.incarnation,
            )
            self._buffer.append(event)
            for q in self._subscribers:
                q.put(event)
        return event

    def subscribe(
        self,
        from_sequence: int = 0,
        *,
        incarnation: int = 0,
        epoch: int = 0,
        current_epoch: int = 0,
    ) -> EventStream:
        """Events after ``from_sequence``: replayed from the buffer, then live.

        Starts with a ``resync`` event instead of the replay when the buffer no
        longer holds sequence ``from_sequence + 1``, when ``from_sequence`` is
        ahead of this worker, or when the non-zero ``incarnation``/``epoch`` of
        the subscriber's history show it is not this worker's.
        """
        pending: queue.Queue[WorkerEvent | _End] = queue.Queue()
        with self._lock:
            oldest = self._buffer[0].sequence if self._buffer else self._last + 1
            stale = (
                from_sequence < oldest - 1
                or from_sequence > self._last
                or (incarnation != 0 and incarnation != self.incarnation)
                or (epoch != 0 and epoch < self.created_epoch)
            )
            if stale:
                pending.put(self._resync(current_epoch or self.created_epoch))
            else:
                for e in self._buffer:
                    if e.sequence > from_sequence:
                        pending.put(e)
            if self._end is not None:
                pending.put(self._end)
            else:
                self._subscribers.append(pending)
        return EventStream(self, pending)

    def close(self, message: str) -> None:
        """The worker left: publish nothing more, end every subscription with ``message``."""
        with self._lock:
            if self._end is not None:
                return
            self._end = _End(message)
            for q in self._subscribers:
                q.put(self._end)
            self._subscribers.clear()

    def _resync(self, epoch: int) -> WorkerEvent:
        return WorkerEvent(
            "resync",
            (),
            (),
            (),
            self.slot.offset,
            self.slot.worker,
            epoch,
            self._last,
            self.incarnation,
        )

    def _unsubscribe(self, pending: queue.Queue[WorkerEvent | _End]) -> None:
        with self._lock:
            if pending in self._subscribers:
                self._subscribers.remove(pending)
