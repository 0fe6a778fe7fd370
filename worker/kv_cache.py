"""The paged KV cache of one rank: block pool, prefix index, LRU, cache events.

Each rank owns a preallocated pool of ``num_blocks`` slots; a slot holds one
block's K and V for every layer, shape [layers, 2, block_size, kv_heads,
head_dim]. The index maps a block's chained key to its slot, its position
in the prefix and its parent (the key at position − 1, which a router needs
to place the block in its trie). Eviction is least-recently-used over blocks not protected by
the running step; a request touches its blocks tail-first so that, among the
blocks of one prefix, the tail is evicted before the head (a head without its
tail is still useful, a tail without its head is not).

Like vLLM's block pool, the cache does no I/O: it appends ``stored``,
``removed`` and ``cleared`` events to a list that the rank drains after each
command; the engine folds them into worker-level events
(:mod:`vertumnus.worker.events`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from .blocks import Block


@dataclass(frozen=True)
class CacheEvent:
    """What changed on ``rank``: blocks that became available (``stored``), were
    dropped (``removed``), or everything dropped at once (``cleared``, no blocks)."""

    kind: str
    block_keys: tuple[int, ...]
    positions: tuple[int, ...]
    parents: tuple[int | None, ...]
    rank: int

    @property
    def blocks(self) -> list[Block]:
        return [Block(*b) for b in zip(self.block_keys, self.positions, self.parents, strict=True)]


@dataclass
class _Entry:
    slot: int
    position: int
    parent: int | None


class PagedKVCache:
    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        rank: int = 0,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.block_size = block_size
        self.rank = rank
        self.pool = torch.zeros(
            (num_blocks, layers, 2, block_size, kv_heads, head_dim), dtype=dtype, device=device
        )
        self._free = list(range(num_blocks - 1, -1, -1))
        self._index: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._events: list[CacheEvent] = []

    # -- queries ---------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.shape[0]

    @property
    def block_bytes(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()

    def __contains__(self, key: int) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._index))

    def keys(self) -> list[int]:
        return list(self._index)

    def position(self, key: int) -> int:
        return self._index[key].position

    def blocks(self) -> list[Block]:
        """Every cached block, from the next to be evicted to the most recently used."""
        return [Block(k, e.position, e.parent) for k, e in self._index.items()]

    def lru_order(self) -> list[int]:
        """Keys from the next to be evicted to the most recently used."""
        return list(self._index)

    def read(self, keys: Sequence[int]) -> torch.Tensor:
        """Copies of the blocks ``keys`` (all must be present), stacked on dim 0."""
        slots = torch.tensor([self._index[k].slot for k in keys], dtype=torch.long)
        return self.pool.index_select(0, slots.to(self.pool.device))

    # -- updates -----------------------------------------------------------------

    def touch(self, keys: Sequence[int]) -> None:
        """Mark a prefix's blocks used; the head ends up most recent."""
        for k in reversed(keys):
            if k in self._index:
                self._index.move_to_end(k)

    def reserve(self, count: int, protect: Iterable[int] = ()) -> list[int]:
        """Up to ``count`` free slots, evicting LRU blocks not in ``protect``.

        Returns fewer slots when everything left is protected; the caller
        then caches fewer blocks, which is always safe.
        """
        protected = set(protect)
        slots: list[int] = []
        evicted: list[Block] = []
        while len(slots) < count:
            if self._free:
                slots.append(self._free.pop())
                continue
            victim = next((k for k in self._index if k not in protected), None)
            if victim is None:
                break
            entry = self._index.pop(victim)
            evicted.append(Block(victim, entry.position, entry.parent))
            slots.append(entry.slot)
        if evicted:
            self._emit("removed", evicted)
        return slots

    def release(self, slots: Iterable[int]) -> None:
        """Return reserved slots that were not committed."""
        self._free.extend(slots)

    def write(self, slot: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.pool[slot, layer, 0].copy_(k)
        self.pool[slot, layer, 1].copy_(v)

    def commit(self, blocks: Sequence[tuple[Block, int]]) -> None:
        """Publish written slots: ``(block, slot)`` pairs.

        Later positions enter the LRU order first (older), like :meth:`touch`.
        """
        for block, slot in sorted(blocks, key=lambda b: -b[0].position):
            self._index[block.key] = _Entry(slot, block.position, block.parent)
        if blocks:
            self._emit("stored", [b for b, _ in blocks])

    def insert(self, blocks: Sequence[Block], data: torch.Tensor) -> int:
        """Install copied blocks (``data`` stacked like :meth:`read`); returns how many fit."""
        new = [(b, i) for i, b in enumerate(blocks) if b.key not in self._index]
        slots = self.reserve(len(new), protect=[b.key for b in blocks])
        done = []
        for (block, i), slot in zip(new, slots, strict=False):
            self.pool[slot].copy_(data[i])
            done.append((block, slot))
        self.commit(done)
        return len(done)

    def evict(self, keys: Iterable[int]) -> list[int]:
        """Drop the given blocks (reclamation); returns the keys actually removed."""
        removed = []
        for k in keys:
            entry = self._index.pop(k, None)
            if entry is not None:
                self._free.append(entry.slot)
                removed.append(Block(k, entry.position, entry.parent))
        if removed:
            self._emit("removed", removed)
        return [b.key for b in removed]

    def clear(self) -> int:
        """Drop every block; one ``cleared`` event. Returns how many were held."""
        count = len(self._index)
        self._free.extend(e.slot for e in self._index.values())
        self._index.clear()
        self._emit("cleared", [])
        return count

    def drain_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    def _emit(self, kind: str, blocks: list[Block]) -> None:
        self._events.append(
            CacheEvent(
                kind,
                tuple(b.key for b in blocks),
                tuple(b.position for b in blocks),
                tuple(b.parent for b in blocks),
                self.rank,
            )
        )
