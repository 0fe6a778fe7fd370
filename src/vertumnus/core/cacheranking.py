"""One scan's three ranked candidate lists (design.md section 6), computed as far as read.

The cache manager (:mod:`vertumnus.core.cachemanager`) ranks every tracked
(z, C) of its counter table (:mod:`vertumnus.core.cachecounters`), r =
ReplicaCount(z, C) among the available workers:

- **inter** (r = 0, missed > θ_inter): key (−missed/footprint, footprint,
  −depth, key, C);
- **intra** (r > 0, access > r·θ_intra): key (−band(access/r), footprint,
  −access/r, key, C), band = near-tie bucket of the score;
- **reclaim** (r ≥ reclaim_min_replicas, access < r·θ_reclaim): key
  (access/r, −depth, key, C), lowest first.

A scan executes a bounded number of operations, so it reads only the head of
each list. :class:`Ranking` therefore works in three steps:

1. Vectorized over the table: the (z, C) that can cross a threshold at all,
   and for each a *bound* on its key that needs no index access (the most
   favourable replica count and footprint: r = 1 or the number of degree-C
   workers, footprint ≥ 1).
2. In increasing order of that bound, in batches that grow (the first one
   sized for the selection, so a small table is one batch: a plain exact
   evaluation and sort; intra sizes the next one from the band still
   waiting): the batch's blocks from the store, replica counts and the
   generation check (the block counted is the one in the index) for the
   whole batch at C speed (``map`` over the holder sets), then NumPy for
   scores.
   Reclamation, which reads ~8 × 256 of up to (tracked nodes × degrees)
   pairs, mostly ties at access 0, selects its batches over dense per-degree
   blocks of the table (:func:`_lex_batches_dense`: a pair that is no
   candidate has bound +inf), with no index array over all pairs; the tie
   columns are cut column by column (:func:`_lex_select`), depths by
   counting rather than partitioning.
3. Footprints (path walks up the ``parent`` keys, Python) only for the
   intra/inter items read, one at a time in order of the exact part of the
   key (:func:`_exact_order`).
   A walk goes only as far as it can matter against the best key found so
   far: an inter candidate with ``missed`` m stops after m/score(best)
   blocks without a holder (an intra one after the best's footprint, in
   its band) and comes back later with the floor found, (−m/f, f), if the
   reader gets that far.

A key found below the bound of every item not yet evaluated is final, so each
list comes out exactly as a full sort would order it
(``tests/cachemanager/test_scan_reference.py`` checks that against a naive
reference, with tiny, small and huge batches on the same tries).

The :class:`~vertumnus.core.store.BlockInfo` objects a ranking reads from the
store are kept for that scan only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, eq
from typing import Any, Literal, Protocol, TypeVar, cast

import numpy as np

from vertumnus.core.cachecounters import CounterTable
from vertumnus.core.cachesettings import CacheManagerSettings
from vertumnus.core.placement import WorkerState
from vertumnus.core.store import BlockInfo, TrieStore

__all__ = ["Candidate", "RankedLists", "Ranking"]

_T = TypeVar("_T")
_V = TypeVar("_V")
_Array = np.ndarray[Any, Any]
_Key = tuple[Any, ...]
_holders = attrgetter("holders")
_generation = attrgetter("generation")


class _Missing:
    """Stands in for a block no longer in the index: no holders, no generation."""

    __slots__ = ()
    key = 0
    depth = 0
    parent = None
    holders: frozenset[int] = frozenset()
    generation = None


_MISSING = cast(BlockInfo, _Missing())


@dataclass(frozen=True, slots=True)
class Candidate:
    """A (z, C) that crossed a threshold in a scan."""

    kind: Literal["inter", "intra", "reclaim"]
    key: int
    degree: int
    replicas: int
    """ReplicaCount(z, C) at the scan."""
    score: float
    """inter: missed per copied block; intra and reclaim: access / r."""
    footprint: int = 0
    """Replication: fewest blocks any feasible destination lacks; 0 for reclaim."""
    depth: int = 0


class RankedLists(Protocol):
    """The three candidate lists a selection reads, each in rank order."""

    @property
    def inter(self) -> Iterator[Candidate]: ...

    @property
    def intra(self) -> Iterator[Candidate]: ...

    def reclaim_head(self) -> list[Candidate]:
        """The first ``reclaim_ranked_per_scan`` reclamation candidates."""
        ...


class Ranking:
    """The candidate lists of one scan (see the module docstring): ``inter``
    and ``intra`` are iterators in rank order, :meth:`reclaim_head` the first
    ``reclaim_ranked_per_scan`` reclamation candidates (a :class:`RankedLists`).
    ``gone`` collects the slots whose block turned out to have left the index.

    ``workers`` and ``store``: the pool as the scan sees it; ``covered``: the
    (key, degree) on the path of a copy in flight, ``copy_dest``: the (key,
    destination) of the copies in flight. ``first_batch`` (a test and tuning
    knob) is the first batch size of every list, in place of the ones derived
    from the per-scan bounds, and every later one then grows 4× (1 evaluates
    every list lazily, batch after batch; a huge one is one plain exact
    evaluation and sort). The lists are the same whatever it is.
    """

    def __init__(
        self,
        table: CounterTable,
        settings: CacheManagerSettings,
        workers: Iterable[WorkerState],
        store: TrieStore,
        covered: Iterable[tuple[int, int]],
        copy_dest: Iterable[tuple[int, int]],
        *,
        first_batch: int | None = None,
    ) -> None:
        if first_batch is not None and first_batch < 1:
            raise ValueError(f"first_batch must be >= 1, got {first_batch}")
        s = self.settings = settings
        self.table = table
        self.batch = first_batch
        workers = [w for w in workers if w.available]
        self.by_degree: dict[int, list[WorkerState]] = {}
        for w in workers:
            self.by_degree.setdefault(w.degree, []).append(w)
        self.ids = {c: frozenset(w.id for w in ws) for c, ws in self.by_degree.items()}
        """Available worker ids per degree: ReplicaCount(z, C) = |holders ∩ ids[C]|."""
        self.room = {w.id: s.max_copy_fraction * w.cache_capacity_blocks for w in workers}
        """Most blocks a copy to each worker may need ("enough capacity")."""
        self._reach: dict[frozenset[int], float] = {}
        """Most room among a set of destinations (walks start from a few sets)."""
        for c in sorted(self.by_degree):
            table.column(c)  # a column per available degree (reclamation reads zeros too)
        self.block = store.block
        # Ranked as of the scan's start: the selection adds copies (and their
        # paths and destinations) while it reads the lists.
        self.covered = set(covered)
        self.copy_dest = set(copy_dest)
        self.copy_dest_keys = {k for k, _ in self.copy_dest}
        self.gone: set[int] = set()
        self.access, self.missed, self.depth = table.views()
        self.columns = [(col, c) for col, c in enumerate(table.degrees) if c in self.by_degree]
        # (slot, column) of covered pairs, as slot·columns + column (np.isin).
        self.covered_ids = table.pair_ids(self.covered)
        first = self.batch or 4 * max(s.max_inter_per_scan, s.max_intra_per_scan) + 16
        self.inter: Iterator[Candidate] = self._inter(first)
        self.intra: Iterator[Candidate] = self._intra(first)

    # -- shared steps -----------------------------------------------------------

    def _pairs(self, select: Callable[[int, int], _Array]) -> tuple[_Array, _Array]:
        """(slots, columns) of the (z, C) whose slot ``select(col, degree)``
        lists, column by column."""
        slots, cols = [], []
        for col, c in self.columns:
            sl = select(col, c)
            slots.append(sl)
            cols.append(np.full(sl.size, col, dtype=np.intp))
        if not slots:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
        return np.concatenate(slots), np.concatenate(cols)

    def _gather(self, table: list[_Array], slots: _Array, cols: _Array) -> _Array:
        out = np.empty(slots.size)
        for col, _ in self.columns:
            m = cols == col
            out[m] = table[col][slots[m]]
        return out

    def _blocks(self, slots: _Array) -> list[BlockInfo]:
        """The blocks of a batch of slots, from the store (a stand-in with no
        holders for a key no longer in the index): one lookup per pair, the
        main cost of reading through the store protocol (a probe of the
        index's dict, ~0.2 µs; deduplicating a slot's two pairs first costs
        more than the second lookup, which hits the cache)."""
        keys = cast(list[int], self.table.block_keys)
        blocks = list(map(self.block, map(keys.__getitem__, slots.tolist())))
        if None in blocks:
            return [_MISSING if b is None else b for b in blocks]
        return cast(list[BlockInfo], blocks)

    def _replicas(
        self, slots: _Array, cols: _Array, min_holders: int = 0
    ) -> tuple[list[BlockInfo], _Array]:
        """For a batch of pairs, at C speed (``map`` over the holder sets): the
        blocks and ReplicaCount(z, C), left 0 where z has fewer than
        ``min_holders`` holders in all."""
        nodes = self._blocks(slots)
        holders = list(map(_holders, nodes))
        r = np.zeros(len(nodes), dtype=np.int64)
        if min_holders > 1:
            many = np.fromiter(map(len, holders), np.int64, len(nodes)) >= min_holders
            holders = list(compress(holders, many.tolist()))
            cols = cols[many]
        else:
            many = None
        r_some = np.zeros(len(holders), dtype=np.int64)
        for col, c in self.columns:
            m = cols == col
            k = int(np.count_nonzero(m))
            if k:
                sets = compress(holders, m.tolist())
                r_some[m] = np.fromiter(map(len, map(self.ids[c].intersection, sets)), np.int64, k)
        if many is None:
            return nodes, r_some
        r[many] = r_some
        return nodes, r

    def _unheld(self, slots: _Array, cols: _Array) -> tuple[list[BlockInfo], _Array]:
        """For a batch of pairs, at C speed: the blocks and whether
        ReplicaCount(z, C) = 0 (no set is built, unlike :meth:`_replicas`)."""
        nodes = self._blocks(slots)
        holders = list(map(_holders, nodes))
        out = np.zeros(len(nodes), dtype=bool)
        for col, c in self.columns:
            m = cols == col
            k = int(np.count_nonzero(m))
            if k:
                sets = compress(holders, m.tolist())
                out[m] = np.fromiter(map(self.ids[c].isdisjoint, sets), bool, k)
        return nodes, out

    def _in_index(self, nodes: list[BlockInfo], slots: _Array, keep: _Array) -> _Array:
        """``keep`` (indices into the batch) less the pairs whose slot counts a
        block that left the index (the key is gone, or back as a new
        incarnation: another generation); their slots go to ``gone``."""
        kept = keep.tolist()
        gens = self.table.generations
        here = np.fromiter(
            map(
                eq,
                map(_generation, map(nodes.__getitem__, kept)),
                map(gens.__getitem__, slots[keep].tolist()),
            ),
            bool,
            len(kept),
        )
        if here.all():
            return keep
        self.gone.update(slots[keep[~here]].tolist())
        return keep[here]

    def _not_covered(self, slots: _Array, cols: _Array) -> _Array | bool:
        if not self.covered_ids.size:
            return True
        return ~np.isin(slots * len(self.table.degrees) + cols, self.covered_ids)

    def _footprint(self, node: BlockInfo, c: int, cap: int | None = None) -> int | None:
        """Fewest blocks a feasible degree-C destination lacks for a copy of z, or
        None (as of the scan's start), by one walk up from z (its ``parent``
        keys) that stops at the first feasible destination: what a destination
        lacks only grows with the distance to the deepest ancestor it holds.
        With ``cap``, a walk that finds no holder within ``cap`` blocks stops
        there and returns −f (f > cap): the footprint, if any, is at least f."""
        key, depth = node.key, node.depth
        pend = self.ids[c] - node.holders
        if key in self.copy_dest_keys:
            pend = frozenset(w for w in pend if (key, w) not in self.copy_dest)
        if not pend:
            return None
        room = self.room
        reach = self._reach.get(pend)
        if reach is None:
            reach = self._reach[pend] = max(room[w] for w in pend)
        block = self.block
        n = block(node.parent)
        stop = depth - cap if cap is not None else 0
        while True:
            # Up to the nearest ancestor that some destination left holds: the
            # walk's hot loop, one lookup and one C call per block. (What a
            # destination lacks only grows on the way, so nothing is decided
            # in between.)
            while n is not None and n.depth >= stop and n.holders.isdisjoint(pend):
                n = block(n.parent)
            if n is None:
                # The rest hold nothing of the path.
                return depth if depth <= reach else None
            missing = depth - n.depth
            if missing > reach:
                return None  # more than any of them may take, and growing
            if n.depth < stop:
                return -missing  # (not n nor anything above it looked at)
            hit = n.holders & pend
            if any(missing <= room[w] for w in hit):
                return missing
            pend = pend - hit
            if not pend:
                return None
            reach = max(room[w] for w in pend)
            n = block(n.parent)

    def _band(self, score: float) -> float:
        """Near-tie band of an intra score (higher is better): geometric buckets
        of width 1 + tie_tolerance; the score itself with no tolerance."""
        tol = self.settings.tie_tolerance
        return math.floor(math.log(score) / math.log1p(tol)) if tol > 0 else score

    # -- inter ----------------------------------------------------------------------

    def _inter(self, first: int) -> Iterator[Candidate]:
        t = self.settings.theta_inter
        used = self.depth > 0
        slots, cols = self._pairs(lambda col, c: np.flatnonzero((self.missed[col] > t) & used))
        missed = self._gather(self.missed, slots, cols)

        def bounded() -> Iterator[tuple[_Key, _InterItem]]:
            # missed/footprint ≤ missed (a footprint is ≥ 1 block): the bound
            # (−missed,) is ≤ the key. Replica counts and coverage per batch.
            for head in _lex_batches([(-missed).__getitem__], slots.size, first):
                sl, co = slots[head], cols[head]
                nodes, none_held = self._unheld(sl, co)
                keep = np.flatnonzero(none_held & self._not_covered(sl, co))
                keep = self._in_index(nodes, sl, keep)
                degrees = self.table.degrees
                for i, col, m in zip(
                    keep.tolist(), co[keep].tolist(), missed[head[keep]].tolist(), strict=True
                ):
                    yield (-m,), (nodes[i], degrees[col], m)

        for (neg_score, fp, neg_depth, key, c), _ in _exact_order(bounded(), self._inter_key):
            yield Candidate("inter", key, c, 0, -neg_score, fp, -neg_depth)

    def _inter_key(self, item: _InterItem, top: _Key | None) -> _Exact:
        # Walked only as far as it can matter against ``top``, the smallest
        # key known: past m/score(top) blocks, the item ranks after it and
        # comes back with the floor found, (−missed/f, f) (a footprint ≥ f).
        # The Candidate is made from the key, for the items read only.
        node, c, missed = item
        cap = int(missed / -top[0]) + 1 if top is not None and top[0] < 0 else None
        fp = self._footprint(node, c, cap)
        if fp is None:
            return None
        if fp < 0:
            return (missed / fp, -fp), item, False
        return (-(missed / fp), fp, -node.depth, node.key, c), None, True

    # -- intra ----------------------------------------------------------------------

    def _intra(self, first: int) -> Iterator[Candidate]:
        s = self.settings
        t, tol = s.theta_intra, s.tie_tolerance
        used = self.depth > 0
        slots, cols = self._pairs(lambda col, c: np.flatnonzero((self.access[col] > t) & used))
        access = self._gather(self.access, slots, cols)
        neg_access = -access
        log_step = math.log1p(tol) if tol > 0 else 0.0
        degrees = self.table.degrees

        def batches() -> Generator[
            tuple[list[tuple[_Key, _IntraItem]], _Key | None], _Key | None, None
        ]:
            # Stage 1, exact: (−band, key, C), from replica counts per batch.
            done = 0
            heads = _lex_batches([neg_access.__getitem__], slots.size, first)
            head = next(heads, None)
            while head is not None:
                done += head.size
                sl, co = slots[head], cols[head]
                nodes, r = self._replicas(sl, co)
                a = access[head]
                keep = np.flatnonzero((r > 0) & (a > r * t) & self._not_covered(sl, co))
                keep = self._in_index(nodes, sl, keep)
                score = a[keep] / r[keep]
                if log_step:
                    logs = np.fromiter(map(math.log, score.tolist()), float, keep.size)
                    band = np.floor(logs / log_step)
                else:
                    band = score
                rows = []
                for i, ri, sc, b in zip(
                    keep.tolist(), r[keep].tolist(), score.tolist(), band.tolist(), strict=True
                ):
                    node, c = nodes[i], degrees[int(co[i])]
                    rows.append(((-b, node.key, c), (node, c, ri, sc, b)))
                # Every later item has access/r ≤ access ≤ this batch's last
                # access, so its band is at most that one's (plus a hair of
                # slack against rounding at a band edge).
                last = float(a[-1]) * (1 + 1e-9) if log_step else float(a[-1])
                if done == slots.size:
                    yield rows, None
                    return
                top = yield rows, (-self._band(last),)
                # Next: past every item whose access reaches the band of the
                # last key output (its floor settles that band), at least
                # twice this batch.
                need = 0
                if top is not None:
                    edge = math.exp(-top[0] * log_step) * (1 - 1e-6) if log_step else -top[0]
                    need = int(np.count_nonzero(access >= edge)) - done + 1
                head = heads.send(None if self.batch else max(need, 2 * head.size))

        # Stage 2: footprints (path walks) only for the bands read.
        staged = (((key[0],), item) for key, item in _merge_batches(batches()))
        for _, cand in _exact_order(staged, self._intra_key):
            yield cast(Candidate, cand)

    def _intra_key(self, item: _IntraItem, top: _Key | None) -> _Exact:
        # Within the band of ``top`` (the smallest key known), walked only up
        # to its footprint: past that, the item ranks after it and comes back
        # with the floor found, (−band, f) (a footprint ≥ f).
        node, c, r, score, band = item
        cap = top[1] if top is not None and top[0] == -band else None
        fp = self._footprint(node, c, cap)
        if fp is None:
            return None
        if fp < 0:
            return (-band, -fp), item, False
        return (
            (-band, fp, -score, node.key, c),
            Candidate("intra", node.key, c, r, score, fp, node.depth),
            True,
        )

    # -- reclaim ----------------------------------------------------------------------

    def reclaim_head(self) -> list[Candidate]:
        """The first ``reclaim_ranked_per_scan`` reclamation candidates."""
        s = self.settings
        want = s.reclaim_ranked_per_scan
        if want <= 0:
            return []
        t, min_r = s.theta_reclaim, s.reclaim_min_replicas
        used = self.depth > 0
        most = {c: len(ws) for c, ws in self.by_degree.items()}
        blocks = [(col, c) for col, c in self.columns if most[c] >= min_r]
        if not blocks:
            return []
        # Pairs as ids p = j·N + slot over dense blocks, one per degree j that
        # can have r ≥ min_r (N: the table's size), so the mass of pairs is
        # never gathered: a pair that is no candidate (or already evaluated)
        # has bound +inf. access/r ≥ access/R_C (R_C: the degree-C workers),
        # so the bound (access/R_C, −depth, key, C) is ≤ the key.
        size = self.depth.size
        bound = np.empty(len(blocks) * size)
        for j, (col, c) in enumerate(blocks):
            a, seg = self.access[col], bound[j * size : (j + 1) * size]
            np.divide(a, most[c], out=seg)
            np.copyto(seg, np.inf, where=~((a < most[c] * t) & used))
        block_col = np.array([col for col, _ in blocks], dtype=np.intp)
        block_degree = np.array([c for _, c in blocks], dtype=np.int64)
        depth, degrees = self.depth, np.array(self.table.degrees, dtype=np.int64)
        if self.table.wide_keys:
            block_keys = self.table.block_keys

            def keys(p: _Array) -> _Array:
                return np.array([block_keys[x] for x in (p % size).tolist()], dtype=object)
        else:
            all_keys = np.frombuffer(self.table.keys, dtype=np.uint64)

            def keys(p: _Array) -> _Array:
                return all_keys[p % size]

        # (Key columns after the first are computed for ties only.)
        columns: list[Callable[[_Array], _Array]] = [
            bound.__getitem__,
            lambda p: -depth[p % size],
            keys,
            lambda p: block_degree[p // size],
        ]

        # Exact keys per batch, as columns; the head so far is final once its
        # last key is below the bound of the last item evaluated (all later
        # items have bounds, hence keys, at least that).
        found: list[list[_Array]] = []
        done = valid = 0
        n = int(np.count_nonzero(bound < np.inf))
        batches = _lex_batches_dense(bound, columns[1:], n, self.batch or 8 * want)
        head = next(batches, None)
        while head is not None:
            done += head.size
            sl, co = head % size, block_col[head // size]
            batch_nodes, r = self._replicas(sl, co, min_r)
            a = self._gather(self.access, sl, co)
            keep = self._in_index(batch_nodes, sl, np.flatnonzero((r >= min_r) & (a < r * t)))
            kept = head[keep]
            valid += keep.size
            found.append(
                [a[keep] / r[keep], -depth[sl[keep]], keys(kept), degrees[co[keep]], r[keep]]
            )
            exact = [np.concatenate(c) for c in zip(*found, strict=True)]
            top = _lex_head([c.__getitem__ for c in exact[:4]], np.arange(exact[0].size), want)
            found = [[c[top] for c in exact]]
            if done == n:
                break
            if top.size == want:
                last = tuple(c[-1:].tolist()[0] for c in found[0][:4])
                if last < tuple(f(head[-1:]).tolist()[0] for f in columns):
                    break
            # Next batch: enough for the head at the yield seen so far (at most 4×).
            guess = 2 * want * done // max(valid, 1) - done
            head = batches.send(None if self.batch else max(want, min(4 * head.size, guess)))
        return [
            Candidate("reclaim", key, c, r, score, 0, -neg_depth)
            for found_cols in found
            for score, neg_depth, key, c, r in zip(*[c.tolist() for c in found_cols], strict=True)
        ]


_IntraItem = tuple[BlockInfo, int, int, float, float]
"""(block, degree, replicas, access/r, band)."""
_InterItem = tuple[BlockInfo, int, float]
"""(block, degree, missed)."""
_Exact = tuple[_Key, Any, bool] | None
"""What ``_exact_order``'s ``exact`` returns: (key, value, True), (bound, item, False) or None."""


def _lex_batches(
    keys: Sequence[Callable[[_Array], _Array]], n: int, first: int
) -> Generator[_Array, int | None, None]:
    """Items 0..n−1 in increasing lexicographic order of (keys[0](i), keys[1](i),
    …), as sorted index arrays: the first ``first`` items, then 4× as many
    (or as many as the reader ``send``s) and so on, rather than a full sort
    (most readers stop early). A key column maps an index array to values."""
    left = np.arange(n)
    k = max(1, first)
    taken = np.zeros(n, dtype=bool)
    while left.size:
        head = _lex_head(keys, left, k)
        size = yield head
        if head.size == left.size:
            return
        taken[head] = True
        left = left[~taken[left]]
        k = size or 4 * k


def _lex_batches_dense(
    primary: _Array, rest: Sequence[Callable[[_Array], _Array]], n: int, first: int
) -> Generator[_Array, int | None, None]:
    """As :func:`_lex_batches`, for the ``n`` items i whose first key
    ``primary[i]`` is finite (others are not items), the later key columns
    ``rest``: no index array over all of ``primary`` is built or gathered
    through. Taken items are set to +inf in ``primary`` (when the reader asks
    for the next batch), which is why it is the caller's scratch array."""
    k = max(1, first)
    while n:
        if n <= k:
            head = np.flatnonzero(primary < np.inf)
        else:
            low = primary.min()
            at_low = primary == low
            ties = int(np.count_nonzero(at_low))
            if ties >= k:
                below, tied = np.zeros(0, dtype=np.intp), np.flatnonzero(at_low)
            else:
                kth = np.partition(primary, k - 1)[k - 1]
                below, tied = np.flatnonzero(primary < kth), np.flatnonzero(primary == kth)
            head = np.concatenate([below, _lex_select(rest, tied, k - below.size)])
        head = _lex_sort([primary.__getitem__, *rest], head)
        size = yield head
        if head.size >= n:
            return
        primary[head] = np.inf
        n -= head.size
        k = size or 4 * k


def _lex_head(keys: Sequence[Callable[[_Array], _Array]], idx: _Array, k: int) -> _Array:
    """The ``k`` lexicographically smallest of items ``idx`` (all if fewer), sorted."""
    return _lex_sort(keys, _lex_select(keys, idx, k))


def _lex_select(keys: Sequence[Callable[[_Array], _Array]], idx: _Array, k: int) -> _Array:
    """The ``k`` lexicographically smallest of items ``idx`` (all if fewer), in
    no particular order.

    Selection column by column: items below the k-th value of a column are in,
    items equal to it go on to the next column, so later columns are computed
    for ties only. O(len(idx)) per column: a column of small integers (depths)
    is cut by counting, not partitioned (a mass of ties partitions slowly).
    """
    if idx.size <= k:
        return idx
    parts = []
    for f in keys:
        v = f(idx)
        low = v.min()
        if np.count_nonzero(v == low) >= k:
            kth = low  # (common: a mass of ties at the bottom, slow to partition)
        elif v.dtype == object:
            kth = np.sort(v)[k - 1]
        elif v.dtype.kind in "iu" and int(v.max()) - int(low) <= 4 * v.size:
            counts = np.cumsum(np.bincount((v - low).astype(np.intp)))
            kth = low + v.dtype.type(np.searchsorted(counts, k))
        else:
            kth = np.partition(v, k - 1)[k - 1]
        below = v < kth
        parts.append(idx[below])
        k -= int(np.count_nonzero(below))
        idx = idx[v == kth]
        if idx.size <= k:
            break
    else:
        idx = idx[:k]  # equal in every column: any k of them
    parts.append(idx)
    return np.concatenate(parts)


def _lex_sort(keys: Sequence[Callable[[_Array], _Array]], idx: _Array) -> _Array:
    """Items ``idx`` in increasing lexicographic order of their keys."""
    cols = [f(idx) for f in keys]
    if any(c.dtype == object for c in cols):
        rows = list(zip(*[c.tolist() for c in cols], strict=True))
        return idx[sorted(range(len(rows)), key=rows.__getitem__)]
    return idx[np.lexsort(cols[::-1])]


def _merge_batches(
    batches: Generator[tuple[list[tuple[_Key, _V]], _Key | None], _Key | None, None],
) -> Iterator[tuple[_Key, _V | None]]:
    """(key, value) in increasing key order, from batches of (rows, floor):
    the rows of a batch in any order, ``floor`` ≤ the key of every row of the
    later batches (None after the last). Keys are unique. After each batch
    but the last, (floor, None): no later key is below it (so a reader can
    settle what it holds before the next batch is computed). Each next batch
    is asked for with the last key output (None if none), which the source
    may use to size it."""
    heap: list[tuple[_Key, _V]] = []
    last: _Key | None = None
    got = next(batches, None)
    while got is not None:
        rows, floor = got
        for row in rows:
            heapq.heappush(heap, row)
        while heap and (floor is None or heap[0][0] < floor):
            row = heapq.heappop(heap)
            last = row[0]
            yield row
        if floor is None:
            return
        yield floor, None
        try:
            got = batches.send(last)
        except StopIteration:
            return


def _exact_order(
    stream: Iterable[tuple[_Key, _T | None]],
    exact: Callable[[_T, _Key | None], _Exact],
) -> Iterator[tuple[_Key, Any]]:
    """(key, value) of the items of ``stream`` in increasing order of exact key.

    ``stream`` yields (bound, item) with non-decreasing bounds (item None:
    a bound for what follows, no item). ``exact(item,
    top)``, with ``top`` the smallest key computed and not yet output (None
    if none), is None (not a candidate), (key, value, True) with key ≥ the
    item's bound, keys unique, or (bound, item, False): a bound above
    ``top`` and above the item's previous one, and the item comes back when
    that bound is reached. A computed key below every bound still waiting is
    below the key of every item not computed yet, so it is next in the full
    order: the output is the full sort, while ``exact`` runs only for the
    items read plus those whose bound does not exceed the last key read.
    """
    heap: list[tuple[_Key, Any]] = []
    later: list[tuple[_Key, int, _T]] = []  # items back with a higher bound
    it = iter(stream)
    nxt = next(it, None)
    seq = 0
    item: _T | None
    while True:
        if later and (nxt is None or later[0][0] < nxt[0]):
            bound, _, item = heapq.heappop(later)
        elif nxt is not None:
            bound, item = nxt
            nxt = next(it, None)
        else:
            break
        while heap and heap[0][0] < bound:
            yield heapq.heappop(heap)
        if item is None:
            continue  # (a bound alone: nothing later is below it)
        found = exact(item, heap[0][0] if heap else None)
        if found is None:
            continue
        key, value, final = found
        if final:
            heapq.heappush(heap, (key, value))
        else:
            heapq.heappush(later, (key, seq, cast(_T, value)))
            seq += 1
    while heap:
        yield heapq.heappop(heap)
