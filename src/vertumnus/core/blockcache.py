"""A worker-local prefix cache at block granularity, with LRU eviction.

This is what an engine does natively (vLLM's block pool, SGLang's radix
cache): a worker keeps the KV of recently computed prefixes, up to a capacity
in blocks, and evicts the least recently used when it needs room.

Blocks are chained keys (see :mod:`vertumnus.core.types`), so a cached block
is only useful if every block before it is cached too. To never strand a
block behind an evicted ancestor, a path is touched **leaf first**: after a
touch every ancestor is more recent than its descendants, so the LRU end of
the order always holds a leaf, and plain LRU evicts leaves only.

The cache does no I/O. Every change is returned as a :class:`CacheDelta`
(blocks stored with their position and parent, blocks removed) — the same
shape as the KV events real engines publish — for a shell to feed into the
global prefix index (:mod:`vertumnus.core.store`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class CacheDelta:
    stored: list[tuple[int, int, int | None]] = field(default_factory=list)
    """Blocks stored, as :class:`~vertumnus.core.store.StoredBlock` fields (key,
    position, parent key or None for a first block; plain tuples, which are
    cheaper to build), parents before children."""
    removed: list[int] = field(default_factory=list)
    """Block keys evicted or deleted, children before parents."""

    def __bool__(self) -> bool:
        return bool(self.stored or self.removed)


class BlockCache:
    """LRU prefix cache of one worker, ``capacity`` blocks."""

    __slots__ = ("capacity", "_lru")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        # key -> parent key; order = least recently used first
        self._lru: OrderedDict[int, int | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: int) -> bool:
        return key in self._lru

    def keys_lru_first(self) -> list[int]:
        return list(self._lru)

    def prefixes(self) -> list[tuple[int, ...]]:
        """The cached prefixes as root→leaf key paths, least recently used first.

        A block is a leaf when no other cached block has it as parent; its
        ancestors are all cached (a path is never stranded, see the module
        docstring), so each path walks up to a first block.
        """
        lru = self._lru
        has_child = {p for p in lru.values() if p is not None}
        out = []
        for key in lru:
            if key in has_child:
                continue
            path = [key]
            parent = lru[key]
            while parent is not None:
                path.append(parent)
                parent = lru[parent]
            path.reverse()
            out.append(tuple(path))
        return out

    def match(self, keys: Sequence[int]) -> int:
        """Number of leading ``keys`` cached here (no LRU update)."""
        n = 0
        lru = self._lru
        for k in keys:
            if k not in lru:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[int], n: int) -> None:
        """Mark the first ``n`` keys (all cached) as just used, leaf first."""
        lru = self._lru
        for i in range(n - 1, -1, -1):
            lru.move_to_end(keys[i])

    def insert(self, keys: Sequence[int]) -> CacheDelta:
        """Cache the prefix ``keys`` (as far as capacity allows) and evict LRU leaves.

        Returns what changed. The inserted path is the most recently used
        afterwards, so eviction never removes a block of it.
        """
        delta = CacheDelta()
        n = min(len(keys), self.capacity)
        if n == 0:
            return delta
        lru = self._lru
        present = self.match(keys[:n])
        for i in range(present, n):
            parent = keys[i - 1] if i > 0 else None
            lru[keys[i]] = parent
            delta.stored.append((keys[i], i, parent))
        self.touch(keys, n)
        while len(lru) > self.capacity:
            key, _ = lru.popitem(last=False)
            delta.removed.append(key)
        return delta

    def remove_subtree(self, key: int) -> CacheDelta:
        """Delete ``key`` and every cached block below it (reclamation)."""
        delta = CacheDelta()
        if key not in self._lru:
            return delta
        doomed = {key}
        # Descendants are less recent than their ancestors, i.e. earlier in
        # the LRU order; one pass in reverse order collects them all.
        for k, parent in reversed(self._lru.items()):
            if parent in doomed:
                doomed.add(k)
        for k in list(self._lru):
            if k in doomed:
                del self._lru[k]
                delta.removed.append(k)
        return delta
