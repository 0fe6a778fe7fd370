"""The cache manager's decaying per-block counters (design.md section 6).

:class:`CounterTable` holds ``access[z, C]`` and ``missed[z, C]`` for the
*tracked* blocks — those whose counters are still above a floor — as a
table: one row (slot) per block, one column per degree. Requests update
single cells at Python speed; a scan reads the table with NumPy (thresholds,
the forget test and the decay are vector operations,
:meth:`CounterTable.end_scan`). Rows are flat ``array`` buffers that NumPy
views without copying.

Counters belong to one **incarnation** of a block: a slot records the key and
the generation (:class:`~vertumnus.core.store.BlockInfo`) of the block it
counts. A block that leaves the index and comes back has a new generation,
hence fresh counters; nothing is kept on the store's objects.

A block that is no longer tracked keeps its last counters, exact as of the
epoch it was dropped at, in a dict by key (with its generation), and decays
lazily (``value · decay**(epochs elapsed)``) when touched again. Forgetting
is cheap: the scan only marks the row (negative depth); the values move to
the dict when the slot is reused.

The table follows the store's change cursor (:meth:`TrieStore.changes
<vertumnus.core.store.TrieStore.changes>`): the ``gone`` entries of each
change name the blocks that left the index, so no scan checks every tracked
block for having left it. When the store's log no longer reaches back to the
table's cursor, the next drain checks the generation of every tracked slot
against the store instead.

Used by :mod:`vertumnus.core.cachemanager` (which records into it) and read by
:mod:`vertumnus.core.cacheranking` (which ranks its rows).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, NamedTuple, cast

import numpy as np

from vertumnus.core.store import BlockInfo, TrieStore

__all__ = ["CounterTable", "TrackedBlock", "TrackedBlocks"]

_F64 = np.float64
_I64 = np.int64

DRAIN_AT = 65536
"""Gone entries waiting in the table past which a request drains them at once
(a scan always drains): bounds what a long scan interval piles up."""


_Untracked = tuple[int | None, int, Sequence[float], Sequence[float]]
"""Counters of a block no longer tracked, exact as of an epoch: (generation,
epoch, access per column of the table, missed per column). A plain tuple:
a compaction moves tens of thousands at once."""


class TrackedBlock(NamedTuple):
    """One tracked block and its counters as of now (:attr:`CacheManager.tracked`)."""

    key: int
    generation: int
    depth: int
    access: dict[int, float]
    """access[z, C] per degree C (non-zero ones)."""
    missed: dict[int, float]
    """missed[z, C] per degree C (non-zero ones)."""


class CounterTable:
    """Counters of the tracked blocks; see the module docstring.

    The manager calls :meth:`follow` (the store it serves, before anything
    else), :meth:`record` / :meth:`add_path` (requests), :meth:`counters`
    (inspection) and, per scan, reads the NumPy views (:meth:`views`) and
    ends with :meth:`end_scan`.
    """

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.epoch = 0
        """Scans completed; counters decay once per epoch."""
        self.degrees: list[int] = []
        """Column → degree."""
        self._column_of: dict[int, int] = {}
        self.access: list[array[float]] = []
        """Per column, access[z, C] of each slot's block."""
        self.missed: list[array[float]] = []
        """Per column, missed[z, C] of each slot's block."""
        self.depth: array[int] = array("q")
        """Per slot: the block's depth while tracked; minus it while forgotten in
        place (the block keeps the slot and its counters until the slot is
        reused); 0 when free."""
        self.keys: array[int] = array("Q")
        """Block keys, for rank tie-breaks; 0 for a key outside 64 bits unsigned
        (then ``wide_keys`` and keys are read from ``block_keys``)."""
        self.wide_keys = False
        self.block_keys: list[int | None] = []
        """Per slot: the key of the block it counts (None when free)."""
        self.generations: list[int | None] = []
        """Per slot: the generation of the block it counts (None when free)."""
        self._free: list[int] = []
        """Slots to reuse; an entry whose slot was tracked again since is skipped."""
        self._slot_of: dict[int, int] = {}
        """Slot of each block that has one (tracked or forgotten in place), by key."""
        self._untracked: dict[int, _Untracked] = {}
        """Counters of the blocks forgotten out of the table, by key."""
        self._store: TrieStore | None = None
        self._cursor = 0
        """The store's change cursor as far as the table has read it."""
        self._pending: list[tuple[int, int]] = []
        """(key, generation) of blocks that left the index, not yet applied."""
        self._resync = False
        """The store's log was truncated past the cursor: check every slot."""
        self._grow(64)

    # -- slots ----------------------------------------------------------------

    def _grow(self, cap: int) -> None:
        """Make room for ``cap`` slots. New arrays, not in-place growth: a NumPy
        view of the old ones (a scan's) would forbid resizing them."""
        old = len(self.block_keys)

        def bigger(a: array[Any]) -> array[Any]:
            b = array(a.typecode, bytes(a.itemsize * cap))
            b[:old] = a
            return b

        self.access = [bigger(a) for a in self.access]
        self.missed = [bigger(a) for a in self.missed]
        self.depth = bigger(self.depth)
        self.keys = bigger(self.keys)
        self.block_keys.extend([None] * (cap - old))
        self.generations.extend([None] * (cap - old))
        self._free.extend(range(cap - 1, old - 1, -1))

    @property
    def size(self) -> int:
        """Slots in the table (tracked or not)."""
        return len(self.block_keys)

    def column(self, degree: int) -> int:
        """The column of ``degree``, added if new."""
        col = self._column_of.get(degree)
        if col is None:
            col = self._column_of[degree] = len(self.degrees)
            self.degrees.append(degree)
            n = len(self.block_keys)
            self.access.append(array("d", bytes(8 * n)))
            self.missed.append(array("d", bytes(8 * n)))
        return col

    def pair_ids(self, pairs: Iterable[tuple[int, int]]) -> np.ndarray[Any, Any]:
        """slot · columns + column of each (key, degree) with a slot and a column."""
        slot_of, column_of, ncol = self._slot_of, self._column_of, len(self.degrees)
        return np.array(
            [slot_of[k] * ncol + column_of[c] for k, c in pairs if k in slot_of and c in column_of],
            dtype=np.int64,
        )

    def track(self, block: BlockInfo) -> int:
        """The slot of ``block``'s counters, tracking it (again) if needed."""
        key, generation = block.key, block.generation
        slot = self._slot_of.get(key)
        if slot is not None:
            if self.generations[slot] == generation:
                if self.depth[slot] < 0:
                    # Forgotten in place: its counters stayed in the table (and
                    # were decayed with it), so tracking it again is one write.
                    self.depth[slot] = block.depth
                return slot
            # An earlier incarnation of the key (it left the index): its
            # counters are not this block's.
            self._release([slot], keep=False)
        old = self._untracked.pop(key, None)
        if old is not None and old[0] != generation:
            old = None  # (an earlier incarnation's)
        slot = self._alloc()
        self.block_keys[slot] = key
        self.generations[slot] = generation
        self.depth[slot] = block.depth
        if 0 <= key < 1 << 64:
            self.keys[slot] = key
        else:
            self.wide_keys = True
        self._slot_of[key] = slot
        if old is not None and (old[2] or old[3]):
            _, epoch, acc, mis = old
            f = self.decay ** (self.epoch - epoch)
            for col, v in enumerate(acc):
                self.access[col][slot] = v * f
            for col, v in enumerate(mis):
                self.missed[col][slot] = v * f
        return slot

    def _alloc(self) -> int:
        while True:
            if not self._free:
                self._grow(2 * len(self.block_keys))
            slot = self._free.pop()
            if self.depth[slot] <= 0:
                break  # (> 0: tracked again in place since it was listed)
        if self.depth[slot] < 0:
            # Forgotten in place: only now do its counters leave the table.
            self._release([slot], keep=True, free=False)
        return slot

    def _release(self, slots: Sequence[int], keep: bool, free: bool = True) -> None:
        """Give up ``slots`` (tracked or forgotten in place): with ``keep`` their
        counters move out of the table (the block is still in the index),
        without they are dropped (it left); the rows are zeroed and (with
        ``free``) listed for reuse."""
        if len(slots) < 32:  # (one at a time when tracking a block: no NumPy)
            if keep:
                acc_rows = [tuple(a[s] for a in self.access) for s in slots]
                mis_rows = [tuple(a[s] for a in self.missed) for s in slots]
            else:
                acc_rows = mis_rows = [()] * len(slots)
            for s in slots:
                for a in self.access:
                    a[s] = 0.0
                for a in self.missed:
                    a[s] = 0.0
                self.depth[s] = 0
        else:
            idx = np.array(slots, dtype=np.intp)
            acc = [np.frombuffer(a, dtype=_F64) for a in self.access]
            mis = [np.frombuffer(a, dtype=_F64) for a in self.missed]
            n = len(slots)
            if keep:
                # One tuple of values per slot, built in C (zip), then zeroed in place.
                acc_rows = list(zip(*[a[idx].tolist() for a in acc], strict=True)) or [()] * n
                mis_rows = list(zip(*[a[idx].tolist() for a in mis], strict=True)) or [()] * n
            else:
                acc_rows = mis_rows = [()] * n
            for v in acc + mis:
                v[idx] = 0.0
            np.frombuffer(self.depth, dtype=_I64)[idx] = 0
            del acc, mis
        # Bulk updates in C (map/zip); a slot's key maps back to that slot.
        keys = cast(list[int], [self.block_keys[s] for s in slots])  # (slots in use)
        if keep:
            gens = [self.generations[s] for s in slots]
            rows = zip(gens, repeat(self.epoch), acc_rows, mis_rows, strict=False)
            self._untracked.update(zip(keys, rows, strict=True))
        deque(map(self._slot_of.pop, keys), 0)
        for s in slots:
            self.block_keys[s] = self.generations[s] = None
        if free:
            self._free.extend(slots)

    # -- counting -------------------------------------------------------------

    def _block(self, key: int) -> BlockInfo:
        if self._store is None:
            raise RuntimeError("the counter table follows no store yet (see follow())")
        block = self._store.block(key)
        if block is None:
            raise KeyError(f"block {key:#x} is not in the index")
        return block

    def record(self, key: int, degree: int, access: float = 0.0, missed: float = 0.0) -> None:
        """Add ``access`` to access[z, C] and ``missed`` to missed[z, C] (z: the
        block ``key`` of the store followed; KeyError if it is not there)."""
        slot = self.track(self._block(key))
        col = self.column(degree)
        if access:
            self.access[col][slot] += access
        if missed:
            self.missed[col][slot] += missed

    def add_path(
        self,
        blocks: Sequence[BlockInfo],
        degree: int,
        amounts: Sequence[float] | None,
        missed: bool,
    ) -> None:
        """Add ``amounts[i]`` (1 each without amounts) to access (or missed)
        [blocks[i], degree]: one request's path, the hot path of placement."""
        col = self.column(degree)
        amounts = amounts if amounts is not None else [1.0] * len(blocks)
        slot_of, gens, depth = self._slot_of, self.generations, self.depth
        for block, amount in zip(blocks, amounts, strict=True):
            if amount <= 0.0:
                continue  # (a zero marginal benefit: the capped last token)
            slot = slot_of.get(block.key)
            if slot is None or depth[slot] <= 0 or gens[slot] != block.generation:
                slot = self.track(block)  # may grow the table: index it afresh
                gens, depth = self.generations, self.depth
            (self.missed if missed else self.access)[col][slot] += amount

    def counters(self, key: int) -> tuple[dict[int, float], dict[int, float]]:
        """(access, missed) per degree as of now of the block ``key`` in the
        store followed (empty for a block never counted or not in the index)."""
        block = self._store.block(key) if self._store is not None else None
        if block is None:
            return {}, {}
        slot = self._slot_of.get(key)
        if slot is not None and self.generations[slot] == block.generation:
            return self._row(self.access, slot), self._row(self.missed, slot)
        old = self._untracked.get(key)
        if old is None or old[0] != block.generation:
            return {}, {}
        _, epoch, acc, mis = old
        f = self.decay ** (self.epoch - epoch)
        degrees = self.degrees
        return (
            {degrees[c]: v * f for c, v in enumerate(acc) if v},
            {degrees[c]: v * f for c, v in enumerate(mis) if v},
        )

    def _row(self, cols: list[array[float]], slot: int) -> dict[int, float]:
        return {self.degrees[c]: a[slot] for c, a in enumerate(cols) if a[slot]}

    # -- following the store ----------------------------------------------------

    def follow(self, store: TrieStore, drain: bool = False) -> None:
        """Serve ``store`` (a new one: every counter so far is dropped) and read
        its changes since last time; with ``drain``, forget the tracked
        blocks that left it. Without, what left is still applied once more
        than :data:`DRAIN_AT` blocks wait."""
        if store is not self._store:
            self._release([s for s, k in enumerate(self.block_keys) if k is not None], keep=False)
            self._untracked.clear()
            self._store = store
            self._cursor = store.cursor
            self._pending = []
            self._resync = False
            return
        if store.cursor != self._cursor:
            cursor, changes = store.changes(self._cursor)
            self._cursor = cursor
            if changes is None:
                self._resync = True
                self._pending = []
            elif not self._resync:
                pending = self._pending
                for change in changes:
                    if change.gone:
                        pending.extend(change.gone)
        if self._resync:
            if drain:
                self._check_all(store)
            return
        if not self._pending or not (drain or len(self._pending) > DRAIN_AT):
            return
        gone, self._pending = self._pending, []
        slot_of, gens, untracked = self._slot_of, self.generations, self._untracked
        slots = []
        for key, generation in gone:
            slot = slot_of.get(key)
            if slot is not None and gens[slot] == generation:
                slots.append(slot)
            else:
                old = untracked.get(key)
                if old is not None and old[0] == generation:
                    del untracked[key]
        self._release(slots, keep=False)

    def _check_all(self, store: TrieStore) -> None:
        """Resynchronise with ``store`` (its log no longer reaches the cursor):
        drop every slot and untracked entry whose block left or changed."""
        block, gens = store.block, self.generations

        def live(key: int, generation: int | None) -> bool:
            b = block(key)
            return b is not None and b.generation == generation

        self._release(
            [s for s, k in enumerate(self.block_keys) if k is not None and not live(k, gens[s])],
            keep=False,
        )
        for key in [k for k, old in self._untracked.items() if not live(k, old[0])]:
            del self._untracked[key]
        self._resync = False

    # -- scans ------------------------------------------------------------------

    def tracked_count(self) -> int:
        return int(np.count_nonzero(np.frombuffer(self.depth, dtype=_I64) > 0))

    def views(
        self,
    ) -> tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
        """NumPy views (no copies) of the access and missed columns and the
        depths, valid until the table next grows or is compacted."""
        return (
            [np.frombuffer(a, dtype=_F64) for a in self.access],
            [np.frombuffer(a, dtype=_F64) for a in self.missed],
            np.frombuffer(self.depth, dtype=_I64),
        )

    def end_scan(self, keep_access: float, keep_missed: float, gone: Sequence[int]) -> None:
        """After a scan: release ``gone`` (slots whose block turned out to have
        left the index), forget the blocks with every access ≤ ``keep_access``
        and every missed ≤ ``keep_missed``, decay every counter and advance
        the epoch."""
        if gone:
            self._release(sorted(gone), keep=False)
        access, missed, depth = self.views()
        live = np.zeros(depth.size, dtype=bool)
        for a in access:
            live |= a > keep_access
        for m in missed:
            live |= m > keep_missed
        # Forget in place: the block keeps its slot and counters (decayed with
        # the table below) until the slot is reused, so this is vector work only.
        drop = np.flatnonzero(~live & (depth > 0))
        depth[drop] = -depth[drop]
        self._free.extend(drop.tolist())
        for a in access + missed:
            a *= self.decay
        del access, missed, depth
        self.epoch += 1
        cap = len(self.block_keys)
        if cap > 4096 and 4 * self.tracked_count() < cap:
            self._compact()
        elif len(self._free) > 2 * cap:
            # (entries of slots tracked again in place pile up otherwise)
            d = np.frombuffer(self.depth, dtype=_I64)
            self._free = np.flatnonzero(d <= 0)[::-1].tolist()

    def _compact(self) -> None:
        """Renumber the tracked slots 0..n−1 in a table about twice that size, so
        a scan's vector work follows the tracked blocks, not a past peak.
        Blocks forgotten in place move their counters out of the table."""
        depth = np.frombuffer(self.depth, dtype=_I64)
        self._release(np.flatnonzero(depth < 0).tolist(), keep=True, free=False)
        keep = np.flatnonzero(depth > 0)
        n = int(keep.size)
        cap = max(64, 2 * n)

        def moved(a: array[Any], dtype: type) -> array[Any]:
            b = array(a.typecode, bytes(a.itemsize * cap))
            np.frombuffer(b, dtype=dtype)[:n] = np.frombuffer(a, dtype=dtype)[keep]
            return b

        self.access = [moved(a, _F64) for a in self.access]
        self.missed = [moved(a, _F64) for a in self.missed]
        self.depth = moved(self.depth, _I64)
        self.keys = moved(self.keys, np.uint64)
        del depth
        kept = keep.tolist()
        self.block_keys = [self.block_keys[s] for s in kept] + [None] * (cap - n)
        self.generations = [self.generations[s] for s in kept] + [None] * (cap - n)
        slot_of = self._slot_of
        for new, (old, key) in enumerate(zip(kept, self.block_keys, strict=False)):
            assert key is not None
            if slot_of.get(key) == old:
                slot_of[key] = new
        self._free = list(range(cap - 1, n - 1, -1))

    # -- inspection -------------------------------------------------------------

    def tracked(self, key: int) -> TrackedBlock | None:
        """The block ``key`` with its counters, if it is tracked."""
        slot = self._slot_of.get(key)
        if slot is None or self.depth[slot] <= 0:
            return None
        gen = self.generations[slot]
        assert gen is not None
        return TrackedBlock(
            key, gen, self.depth[slot], self._row(self.access, slot), self._row(self.missed, slot)
        )

    def tracked_keys(self) -> Iterator[int]:
        depth = self.depth
        return (k for k, slot in list(self._slot_of.items()) if depth[slot] > 0)


class TrackedBlocks(Mapping[int, TrackedBlock]):
    """Read-only view of a table's tracked blocks by key (counters as of now)."""

    __slots__ = ("_table",)

    def __init__(self, table: CounterTable) -> None:
        self._table = table

    def __getitem__(self, key: int) -> TrackedBlock:
        got = self._table.tracked(key)
        if got is None:
            raise KeyError(key)
        return got

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self._table.tracked(key) is not None

    def __iter__(self) -> Iterator[int]:
        return self._table.tracked_keys()

    def __len__(self) -> int:
        return self._table.tracked_count()
