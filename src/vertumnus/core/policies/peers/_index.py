"""Approximate prefix indexes that routers build from their own routing decisions.

SGLang's cache-aware router, llm-d's approximate prefix scorer and AIBrix's
prefix-hash table never see the engines' caches: after routing a request to a
worker they *assume* the worker now caches its prompt and record that. These
indexes reproduce that state at block granularity (the request's chained
block keys), with each router's own eviction so memory stays bounded — and so
the index drifts from the real caches exactly as it does in production.

Both answer "how many leading blocks of this request does each worker hold"
in O(blocks in the request + holders found), never O(index).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class WorkerLRUIndex:
    """Per-worker LRU sets of block keys, with a reverse map key → workers.

    ``capacity`` bounds the blocks remembered per worker (None = unbounded).
    A path is touched leaf first, so every ancestor is more recent than its
    descendants and LRU eviction removes leaves first (the same trick as
    :class:`vertumnus.core.blockcache.BlockCache`; SGLang's tree evicts LRU
    leaves too).
    """

    __slots__ = ("capacity", "_lru", "_holders")

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"index capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self._lru: dict[int, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[int]] = {}

    def size(self, worker: int) -> int:
        """Blocks remembered for ``worker``."""
        lru = self._lru.get(worker)
        return len(lru) if lru is not None else 0

    def __len__(self) -> int:
        return len(self._holders)

    def matched(self, keys: Sequence[int]) -> dict[int, int]:
        """Per worker, leading blocks of ``keys`` it is believed to hold (absent = 0)."""
        depths: dict[int, int] = {}
        alive: set[int] | None = None
        holders = self._holders
        for i, k in enumerate(keys):
            h = holders.get(k)
            if not h:
                break
            # Only workers that held every earlier block continue the prefix.
            alive = set(h) if alive is None else alive & h
            if not alive:
                break
            for w in alive:
                depths[w] = i + 1
        return depths

    def insert(self, worker: int, keys: Sequence[int]) -> None:
        """Record that ``worker`` now holds the prefix ``keys``; evict its LRU leaves over capacity."""
        lru = self._lru.get(worker)
        if lru is None:
            lru = self._lru[worker] = OrderedDict()
        holders = self._holders
        for k in reversed(keys):
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
                h = holders.get(k)
                if h is None:
                    holders[k] = {worker}
                else:
                    h.add(worker)
        if self.capacity is not None:
            self.evict(worker, self.capacity)

    def evict(self, worker: int, keep: int) -> None:
        """Forget ``worker``'s least recently used blocks until it holds at most ``keep``."""
        lru = self._lru.get(worker)
        if lru is None:
            return
        holders = self._holders
        while len(lru) > keep:
            k, _ = lru.popitem(last=False)
            h = holders[k]
            h.discard(worker)
            if not h:
                del holders[k]

    def workers(self) -> list[int]:
        return sorted(self._lru)


class GlobalTTLIndex:
    """One LRU table of block keys shared by all workers, with per-entry expiry.

    AIBrix's ``PrefixHashTable``: a bounded LRU of block hashes, each mapping to
    the pods it was routed to with a last-access time; entries not accessed
    for ``ttl_s`` are dropped by a periodic sweep. Time is the caller's (the
    request's arrival time), so the index stays pure.
    """

    __slots__ = ("capacity", "ttl_s", "_table")

    def __init__(self, capacity: int, ttl_s: float) -> None:
        if capacity < 1 or ttl_s <= 0:
            raise ValueError("GlobalTTLIndex needs capacity >= 1 and ttl_s > 0")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._table: OrderedDict[int, dict[int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def matched(self, keys: Sequence[int], now: float) -> dict[int, int]:
        depths: dict[int, int] = {}
        alive: set[int] | None = None
        horizon = now - self.ttl_s
        table = self._table
        for i, k in enumerate(keys):
            pods = table.get(k)
            if not pods:
                break
            fresh = {w for w, t in pods.items() if t >= horizon}
            alive = fresh if alive is None else alive & fresh
            if not alive:
                break
            for w in alive:
                depths[w] = i + 1
        return depths

    def insert(self, worker: int, keys: Sequence[int], now: float) -> None:
        table = self._table
        for k in reversed(keys):
            pods = table.get(k)
            if pods is None:
                table[k] = {worker: now}
            else:
                pods[worker] = now
                table.move_to_end(k)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def sweep(self, now: float) -> None:
        """Drop pod entries (and then keys) not accessed within ``ttl_s``."""
        horizon = now - self.ttl_s
        for k in list(self._table):
            pods = self._table[k]
            for w in [w for w, t in pods.items() if t < horizon]:
                del pods[w]
            if not pods:
                del self._table[k]
