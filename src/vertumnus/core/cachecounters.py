"""The cache manager's decaying per-node counters (design.md section 6).

:class:`CounterTable` holds ``access[z, C]`` and ``missed[z, C]`` for the
*tracked* trie nodes — those whose counters are still above a floor — as a
table: one row (slot) per node, one column per degree. Requests update single
cells at Python speed; a scan reads the table with NumPy (thresholds, the
forget test and the decay are vector operations, :meth:`CounterTable.end_scan`).
Rows are flat ``array`` buffers that NumPy views without copying.

A node's handle is its :class:`NodeStats`, kept in ``TrieNode.stats``. A node
that is no longer tracked keeps its last counters on that handle, exact as of
the epoch it was dropped at, and decays lazily (``value · decay**(epochs
elapsed)``) when touched again. Forgetting is cheap: the scan only marks the
row (negative depth); the values move to the handle when the slot is reused.

The table follows the trie's removals (``PrefixTrie.removal_log``), so no scan
checks every tracked node for having left it; a node that left is never
tracked again (a key that comes back is a new node, with fresh counters).

Used by :mod:`vertumnus.core.cachemanager` (which records into it) and read by
:mod:`vertumnus.core.cacheranking` (which ranks its rows).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from vertumnus.core.trie import PrefixTrie, RemovalLog, TrieNode

__all__ = ["FORGOTTEN", "GONE", "CounterTable", "NodeStats"]

FORGOTTEN = -1
"""``NodeStats.slot`` of a node the scans stopped tracking (counters below the floor)."""
GONE = -2
"""``NodeStats.slot`` of a node that left the trie: never tracked again."""

_F64 = np.float64
_I64 = np.int64


class NodeStats:
    """Handle to one node's decaying counters, kept in ``TrieNode.stats``.

    While the node is tracked (``slot`` ≥ 0) its counters are row ``slot`` of
    its table and are current. Once forgotten (``slot`` −1) or gone (−2) they
    are kept here, exact as of ``epoch``. ``access`` and ``missed`` are
    read-only snapshots per degree as of ``epoch``.
    """

    __slots__ = ("owner", "slot", "_epoch", "_access", "_missed")

    def __init__(self, owner: CounterTable) -> None:
        self.owner = owner
        self.slot = FORGOTTEN
        self._epoch = owner.epoch
        # While not tracked: the values per column of the owner's table.
        self._access: Sequence[float] = ()
        self._missed: Sequence[float] = ()

    @property
    def epoch(self) -> int:
        return self.owner.epoch if self.slot >= 0 else self._epoch

    @property
    def access(self) -> dict[int, float]:
        """access[z, C] per degree C, as of ``epoch``."""
        return self.owner.values(self, missed=False)

    @property
    def missed(self) -> dict[int, float]:
        """missed[z, C] per degree C, as of ``epoch``."""
        return self.owner.values(self, missed=True)

    def __repr__(self) -> str:
        return f"NodeStats(access={self.access}, missed={self.missed}, epoch={self.epoch})"


class CounterTable:
    """Counters of the tracked nodes; see the module docstring.

    The manager calls :meth:`follow` (the trie it serves), :meth:`record` /
    :meth:`add_path` (requests), :meth:`counters` (inspection) and, per scan,
    reads the NumPy views (:meth:`views`) and ends with :meth:`end_scan`.
    """

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.epoch = 0
        """Scans completed; counters decay once per epoch."""
        self.degrees: list[int] = []
        """Column → degree."""
        self._column_of: dict[int, int] = {}
        self.access: list[array[float]] = []
        """Per column, access[z, C] of each slot's node."""
        self.missed: list[array[float]] = []
        """Per column, missed[z, C] of each slot's node."""
        self.depth: array[int] = array("q")
        """Per slot: the node's depth while tracked; minus it while forgotten in
        place (the node keeps the slot and its counters until the slot is
        reused); 0 when free."""
        self.keys: array[int] = array("Q")
        """Block keys, for rank tie-breaks; 0 for a key outside 64 bits unsigned
        (then ``wide_keys`` and keys are read from ``nodes``)."""
        self.wide_keys = False
        self.nodes: list[TrieNode | None] = []
        self._free: list[int] = []
        """Slots to reuse; an entry whose slot was tracked again since is skipped."""
        self._slot_of: dict[int, int] = {}
        """Slot of each node that has one (tracked or forgotten in place), by key."""
        self._trie: PrefixTrie | None = None
        self._removals: RemovalLog | None = None
        self._grow(64)

    # -- slots ----------------------------------------------------------------

    def _grow(self, cap: int) -> None:
        """Make room for ``cap`` slots. New arrays, not in-place growth: a NumPy
        view of the old ones (a scan's) would forbid resizing them."""
        old = len(self.nodes)

        def bigger(a: array[Any]) -> array[Any]:
            b = array(a.typecode, bytes(a.itemsize * cap))
            b[:old] = a
            return b

        self.access = [bigger(a) for a in self.access]
        self.missed = [bigger(a) for a in self.missed]
        self.depth = bigger(self.depth)
        self.keys = bigger(self.keys)
        self.nodes.extend([None] * (cap - old))
        self._free.extend(range(cap - 1, old - 1, -1))

    def column(self, degree: int) -> int:
        """The column of ``degree``, added if new."""
        col = self._column_of.get(degree)
        if col is None:
            col = self._column_of[degree] = len(self.degrees)
            self.degrees.append(degree)
            n = len(self.nodes)
            self.access.append(array("d", bytes(8 * n)))
            self.missed.append(array("d", bytes(8 * n)))
        return col

    def track(self, node: TrieNode) -> int:
        """The slot of ``node``'s counters, tracking it (again) if needed; −1 for
        a node that left the trie (its counters stay on its NodeStats)."""
        st = node.stats
        if type(st) is NodeStats and st.owner is self:
            slot = st.slot
            if slot >= 0:
                if self.depth[slot] < 0:
                    # Forgotten in place: its counters stayed in the table (and
                    # were decayed with it), so tracking it again is one write.
                    self.depth[slot] = node.depth
                return slot
            if slot == GONE:
                return -1
        else:
            st = NodeStats(self)
            node.stats = st
        key = node.key
        other = self._slot_of.get(key)
        if other is not None:
            # Another node object under this key, so that one left the trie (or
            # its stats were reset): its counters are not this node's.
            self._release([other], GONE)
        slot = self._alloc()
        self.nodes[slot] = node
        self.depth[slot] = node.depth
        if 0 <= key < 1 << 64:
            self.keys[slot] = key
        else:
            self.wide_keys = True
        self._slot_of[key] = slot
        st.slot = slot
        if st._access or st._missed:
            f = self.decay ** (self.epoch - st._epoch)
            for col, v in enumerate(st._access):
                self.access[col][slot] = v * f
            for col, v in enumerate(st._missed):
                self.missed[col][slot] = v * f
            st._access = st._missed = ()
        return slot

    def _alloc(self) -> int:
        while True:
            if not self._free:
                self._grow(2 * len(self.nodes))
            slot = self._free.pop()
            if self.depth[slot] <= 0:
                break  # (> 0: tracked again in place since it was listed)
        if self.depth[slot] < 0:
            # Forgotten in place: only now do its counters move to its NodeStats.
            self._release([slot], FORGOTTEN, free=False)
        return slot

    def _release(self, slots: Sequence[int], state: int, free: bool = True) -> None:
        """Give up ``slots`` (tracked or forgotten in place): their nodes'
        counters move to their NodeStats (``state``: FORGOTTEN or GONE), the
        rows are zeroed and (with ``free``) listed for reuse."""
        if len(slots) < 32:  # (one at a time when tracking a node: no NumPy)
            acc_rows = [tuple(a[s] for a in self.access) for s in slots]
            mis_rows = [tuple(a[s] for a in self.missed) for s in slots]
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
            # One tuple of values per slot, built in C (zip), then zeroed in place.
            n = len(slots)
            acc_rows = list(zip(*[a[idx].tolist() for a in acc], strict=True)) or [()] * n
            mis_rows = list(zip(*[a[idx].tolist() for a in mis], strict=True)) or [()] * n
            for v in acc + mis:
                v[idx] = 0.0
            np.frombuffer(self.depth, dtype=_I64)[idx] = 0
            del acc, mis
        nodes, slot_of, epoch = self.nodes, self._slot_of, self.epoch
        for slot, ra, rm in zip(slots, acc_rows, mis_rows, strict=True):
            node = nodes[slot]
            assert node is not None
            st = node.stats
            if type(st) is NodeStats and st.owner is self and st.slot == slot:
                st.slot = state
                st._epoch = epoch
                st._access = ra
                st._missed = rm
            nodes[slot] = None
            if slot_of.get(node.key) == slot:
                del slot_of[node.key]
        if free:
            self._free.extend(slots)

    # -- counting -------------------------------------------------------------

    def values(self, st: NodeStats, missed: bool) -> dict[int, float]:
        """The counters of ``st`` per degree as of its epoch (see NodeStats)."""
        if st.slot >= 0:
            slot = st.slot
            cols = self.missed if missed else self.access
            return {self.degrees[c]: a[slot] for c, a in enumerate(cols) if a[slot]}
        vals = st._missed if missed else st._access
        return {self.degrees[c]: v for c, v in enumerate(vals) if v}

    def record(self, node: TrieNode, degree: int, access: float = 0.0, missed: float = 0.0) -> None:
        """Add ``access`` to access[z, C] and ``missed`` to missed[z, C] (z = ``node``)."""
        slot = self.track(node)
        col = self.column(degree)
        if slot >= 0:
            if access:
                self.access[col][slot] += access
            if missed:
                self.missed[col][slot] += missed
            return
        # A node that left the trie: counted on its NodeStats, never tracked.
        st = node.stats
        assert isinstance(st, NodeStats)
        f = self.decay ** (self.epoch - st._epoch)
        n = len(self.degrees)
        acc = [v * f for v in st._access] + [0.0] * (n - len(st._access))
        mis = [v * f for v in st._missed] + [0.0] * (n - len(st._missed))
        acc[col] += access
        mis[col] += missed
        st._access, st._missed, st._epoch = acc, mis, self.epoch

    def add_path(
        self, nodes: Sequence[TrieNode], degree: int, amounts: Sequence[float] | None, missed: bool
    ) -> None:
        """Add ``amounts[i]`` (1 each without amounts) to access (or missed)
        [nodes[i], degree]: one request's path, the hot path of placement."""
        col = self.column(degree)
        amounts = amounts if amounts is not None else [1.0] * len(nodes)
        for node, amount in zip(nodes, amounts, strict=True):
            if amount <= 0.0:
                continue  # (a zero marginal benefit: the capped last token)
            st = node.stats
            slot = st.slot if type(st) is NodeStats and st.owner is self else -1
            if slot < 0 or self.depth[slot] <= 0:
                slot = self.track(node)  # may grow the table: index it afresh
                if slot < 0:
                    if missed:
                        self.record(node, degree, missed=amount)
                    else:
                        self.record(node, degree, access=amount)
                    continue
            (self.missed if missed else self.access)[col][slot] += amount

    def counters(self, node: TrieNode) -> tuple[dict[int, float], dict[int, float]]:
        """(access, missed) of ``node`` per degree as of now."""
        st = node.stats
        if not isinstance(st, NodeStats):
            return {}, {}
        access, missed = st.access, st.missed
        if st.slot >= 0:
            return access, missed
        f = self.decay ** (self.epoch - st.epoch)
        return ({c: v * f for c, v in access.items()}, {c: v * f for c, v in missed.items()})

    # -- the trie's removals ----------------------------------------------------

    def follow(self, trie: PrefixTrie, drain: bool = False) -> None:
        """Serve ``trie`` (subscribing to its removals when it is a new one);
        with ``drain``, forget the tracked nodes that left it since last time.
        Without, the log is still drained once it grows large."""
        if trie is not self._trie:
            self._trie = trie
            self._removals = trie.removal_log()
            # Nodes tracked before (record() needs no trie) that are not in it.
            tnodes = trie.nodes
            self._release(
                [
                    s
                    for s, n in enumerate(self.nodes)
                    if n is not None and tnodes.get(n.key) is not n
                ],
                GONE,
            )
            return
        log = self._removals
        if log is None or not log.nodes or not (drain or len(log.nodes) > 65536):
            return
        dropped, log.nodes = log.nodes, []
        slots = []
        for node in dropped:
            st = node.stats
            if type(st) is NodeStats and st.owner is self:
                if st.slot >= 0 and self.nodes[st.slot] is node:
                    slots.append(st.slot)
                elif st.slot == FORGOTTEN:
                    st.slot = GONE
        self._release(slots, GONE)

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
        """After a scan: release ``gone`` (slots whose node turned out to have
        left the trie), forget the nodes with every access ≤ ``keep_access``
        and every missed ≤ ``keep_missed``, decay every counter and advance
        the epoch."""
        if gone:
            self._release(sorted(gone), GONE)
        access, missed, depth = self.views()
        live = np.zeros(depth.size, dtype=bool)
        for a in access:
            live |= a > keep_access
        for m in missed:
            live |= m > keep_missed
        # Forget in place: the node keeps its slot and counters (decayed with
        # the table below) until the slot is reused, so this is vector work only.
        drop = np.flatnonzero(~live & (depth > 0))
        depth[drop] = -depth[drop]
        self._free.extend(drop.tolist())
        for a in access + missed:
            a *= self.decay
        del access, missed, depth
        self.epoch += 1
        cap = len(self.nodes)
        if cap > 4096 and 4 * self.tracked_count() < cap:
            self._compact()
        elif len(self._free) > 2 * cap:
            # (entries of slots tracked again in place pile up otherwise)
            d = np.frombuffer(self.depth, dtype=_I64)
            self._free = np.flatnonzero(d <= 0)[::-1].tolist()

    def _compact(self) -> None:
        """Renumber the tracked slots 0..n−1 in a table about twice that size, so
        a scan's vector work follows the tracked nodes, not a past peak. Nodes
        forgotten in place move their counters to their NodeStats."""
        depth = np.frombuffer(self.depth, dtype=_I64)
        self._release(np.flatnonzero(depth < 0).tolist(), FORGOTTEN, free=False)
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
        old_nodes = self.nodes
        self.nodes = [old_nodes[s] for s in keep.tolist()] + [None] * (cap - n)
        for new, (old, node) in enumerate(zip(keep.tolist(), self.nodes, strict=False)):
            assert node is not None
            st = node.stats
            if type(st) is NodeStats and st.owner is self and st.slot == old:
                st.slot = new
            if self._slot_of.get(node.key) == old:
                self._slot_of[node.key] = new
        self._free = list(range(cap - 1, n - 1, -1))


class TrackedNodes(Mapping[int, TrieNode]):
    """Read-only view of a table's tracked nodes by block key."""

    __slots__ = ("_table",)

    def __init__(self, table: CounterTable) -> None:
        self._table = table

    def __getitem__(self, key: int) -> TrieNode:
        t = self._table
        slot = t._slot_of[key]
        node = t.nodes[slot]
        if node is None or t.depth[slot] <= 0:
            raise KeyError(key)
        return node

    def __contains__(self, key: object) -> bool:
        slot = self._table._slot_of.get(key)  # type: ignore[call-overload]
        return slot is not None and self._table.depth[slot] > 0

    def __iter__(self) -> Iterator[int]:
        depth = self._table.depth
        return (k for k, slot in list(self._table._slot_of.items()) if depth[slot] > 0)

    def __len__(self) -> int:
        return self._table.tracked_count()
