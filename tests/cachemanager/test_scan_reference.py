"""The scan against a straightforward reference on seeded random indexes.

The manager ranks lazily (vectorized bounds, exact keys in batches of
growing size, footprints only for the head that the bounded selection reads;
``Ranking`` in cacheranking.py) and keeps its counters in a table decayed by
each scan that follows the store's change cursor (cachecounters.py). Each
scenario also runs with first batches of one item (every list evaluated
lazily, batch after batch) and of "everything" (one plain exact evaluation
and sort), the two ends of the size choice, and with a change log so short
that the table must resynchronise from the store. The reference here keeps
plain dicts per (key, generation), walks every destination's path for each
footprint, builds the three candidate lists in full and sorts them; both then
run the same selection (``CacheManager.select``) over identical stores, so
every scan must produce the same operations, the same heads of the rankings,
and ``candidates()`` the same full lists. The stores change between scans
(blocks stored and removed, tracked blocks leaving and keys coming back,
workers dropped), and in-flight copies and reclamations finish at random.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest

from vertumnus.core.cachemanager import (
    CacheManager,
    CacheManagerSettings,
    Candidate,
    Copy,
    Reclaim,
    ScanPlan,
)
from vertumnus.core.placement import WorkerState
from vertumnus.core.trie import PrefixTrie

from .helpers import View, all_keys, hold, missing_blocks

DEGREES = (4, 4, 4, 8, 8)


class _RefRanking:
    """Full candidate lists from plain per-node counters, sorted outright."""

    def __init__(self, mgr: Reference, view: View) -> None:
        s = mgr.settings
        workers = [w for w in view.workers if w.available]
        by_degree: dict[int, list[WorkerState]] = {}
        for w in workers:
            by_degree.setdefault(w.degree, []).append(w)
        covered = set(mgr.covered)
        copy_dest = set(mgr.copy_destinations)
        inter, intra, reclaim = [], [], []
        store = view.store
        for key, (access, missed) in mgr.live_counters(store):
            node = store.block(key)
            assert node is not None
            for c, peers in by_degree.items():
                r = sum(1 for w in peers if w.id in node.holders)
                fps = []
                for w in peers:
                    if w.id in node.holders or (key, w.id) in copy_dest:
                        continue
                    missing = missing_blocks(store, key, w.id)
                    if missing <= s.max_copy_fraction * w.cache_capacity_blocks:
                        fps.append(missing)
                fp = min(fps) if fps else None
                a, m_ = access.get(c, 0.0), missed.get(c, 0.0)
                if r == 0 and m_ > s.theta_inter and (key, c) not in covered and fp is not None:
                    score = m_ / fp
                    inter.append(
                        (
                            (-score, fp, -node.depth, key, c),
                            Candidate("inter", key, c, 0, score, fp, node.depth),
                        )
                    )
                if r > 0 and a > r * s.theta_intra and (key, c) not in covered and fp is not None:
                    score = a / r
                    tol = s.tie_tolerance
                    band = math.floor(math.log(score) / math.log1p(tol)) if tol > 0 else score
                    intra.append(
                        (
                            (-band, fp, -score, key, c),
                            Candidate("intra", key, c, r, score, fp, node.depth),
                        )
                    )
                if r >= s.reclaim_min_replicas and a < r * s.theta_reclaim:
                    reclaim.append(
                        (
                            (a / r, -node.depth, key, c),
                            Candidate("reclaim", key, c, r, a / r, 0, node.depth),
                        )
                    )
        self.inter_list = [x for _, x in sorted(inter, key=lambda t: t[0])]
        self.intra_list = [x for _, x in sorted(intra, key=lambda t: t[0])]
        self.reclaim_list = [x for _, x in sorted(reclaim, key=lambda t: t[0])][
            : s.reclaim_ranked_per_scan
        ]
        self.inter: Iterator[Candidate] = iter(self.inter_list)
        self.intra: Iterator[Candidate] = iter(self.intra_list)

    def reclaim_head(self) -> list[Candidate]:
        return list(self.reclaim_list)


class Reference(CacheManager):
    """Counters in plain dicts, decayed eagerly; naive, complete ranking."""

    def __init__(self, settings: CacheManagerSettings, store: PrefixTrie) -> None:
        super().__init__(settings, store=store)
        self.store = store
        # by key: (generation, access, missed, tracked)
        self.ref: dict[int, tuple[int, dict[int, float], dict[int, float], list[bool]]] = {}

    def _live(self, store: PrefixTrie, key: int, generation: int) -> bool:
        block = store.block(key)
        return block is not None and block.generation == generation

    def record(self, key: int, degree: int, access: float = 0.0, missed: float = 0.0) -> None:
        block = self.store.block(key)
        assert block is not None
        entry = self.ref.get(key)
        if entry is None or entry[0] != block.generation:
            entry = self.ref[key] = (block.generation, {}, {}, [True])
        entry[3][0] = True
        if access:
            entry[1][degree] = entry[1].get(degree, 0.0) + access
        if missed:
            entry[2][degree] = entry[2].get(degree, 0.0) + missed

    def live_counters(self, store: PrefixTrie) -> list[tuple[int, tuple[dict, dict]]]:
        return [
            (key, (a, m))
            for key, (gen, a, m, tracked) in self.ref.items()
            if tracked[0] and self._live(store, key, gen)
        ]

    def scan(self, view: View) -> ScanPlan:  # type: ignore[override]
        plan = self.select(view, _RefRanking(self, view))
        s = self.settings
        keep_m = s.counter_floor * s.theta_inter / s.decay
        keep_a = s.counter_floor * s.theta_intra / s.decay
        for k, (gen, a, m, tracked) in list(self.ref.items()):
            if not self._live(view.store, k, gen):
                del self.ref[k]  # left the index: a key that comes back starts afresh
                continue
            if tracked[0] and not (
                any(v > keep_a for v in a.values()) or any(v > keep_m for v in m.values())
            ):
                tracked[0] = False
            for d in (a, m):
                for c in d:
                    d[c] *= s.decay
        plan.tracked_nodes = sum(1 for *_, t in self.ref.values() if t[0])
        self.epoch += 1
        self.counts["scans"] += 1
        return plan

    def candidates(self, view: View) -> ScanPlan:  # type: ignore[override]
        r = _RefRanking(self, view)
        return ScanPlan(
            epoch=self.epoch, inter=r.inter_list, intra=r.intra_list, reclaim=r.reclaim_list
        )


def _same(got: list[Candidate], want: list[Candidate], where: tuple) -> None:
    """Equal lists; scores to rounding (a counter forgotten and then touched
    again is decayed by decay**k at once, the reference's k times)."""
    assert [(x.kind, x.key, x.degree, x.replicas, x.footprint, x.depth) for x in got] == [
        (x.kind, x.key, x.degree, x.replicas, x.footprint, x.depth) for x in want
    ], where
    assert [x.score for x in got] == pytest.approx([x.score for x in want], rel=1e-12), where


def _scenario(
    seed: int, wide_keys: bool, first_batch: int | None = None, log_limit: int = 65536
) -> None:
    rng = random.Random(seed)
    settings = CacheManagerSettings(
        theta_inter=0.5,
        theta_intra=2.0,
        theta_reclaim=1.0,
        tie_tolerance=rng.choice((0.1, 0.25, 0.0)),
        max_inter_per_scan=rng.choice((1, 2, 3)),
        max_intra_per_scan=rng.choice((1, 2, 3)),
        max_reclaim_per_scan=rng.choice((1, 2, 4)),
        reclaim_ranked_per_scan=rng.choice((2, 5, 64)),
        reclaim_for_room_only=rng.random() < 0.5,
        max_copy_fraction=rng.choice((0.3, 1.0)),
        decay=rng.choice((0.5, 0.8)),
        counter_floor=rng.choice((0.05, 0.3)),
    )
    ws = [
        WorkerState(id=i, degree=d, cache_capacity_blocks=rng.randint(4, 30))
        for i, d in enumerate(DEGREES)
    ]
    if rng.random() < 0.3:
        i = rng.randrange(len(ws))
        ws[i] = WorkerState(id=i, degree=DEGREES[i], available=False, cache_capacity_blocks=10)
    views = (View(ws, PrefixTrie(log_limit=log_limit)), View(ws, PrefixTrie()))
    mgr = CacheManager(settings, store=views[0].store, first_batch=first_batch)
    ref = Reference(settings, views[1].store)
    key_pool = [
        (-rng.randrange(1 << 70) if wide_keys and rng.random() < 0.3 else rng.randrange(1 << 64))
        for _ in range(40)
    ]
    paths: list[list[int]] = []
    for step in range(40):
        # Index events, identical on both stores.
        store = views[0].store
        for _ in range(rng.randint(0, 6)):
            w = rng.randrange(len(ws))
            if paths and rng.random() < 0.6:
                base = rng.choice(paths)
                path = base[: rng.randint(1, len(base))]
                if rng.random() < 0.5:
                    path = path + [k for k in rng.sample(key_pool, 2) if k not in path][:1]
            else:
                path = [k for k in rng.sample(key_pool, rng.randint(1, 5))]
                path = list(dict.fromkeys(path))
            # a key may sit under one parent only
            if any(
                (n := store.block(k)) is not None and n.parent != (path[i - 1] if i else None)
                for i, k in enumerate(path)
            ):
                continue
            paths.append(path)
            for v in views:
                hold(v.store, w, path)
        for _ in range(rng.randint(0, 4)):
            leaves = [k for k in all_keys(store) if not store.children(k)]
            if not leaves:
                break
            leaf = rng.choice(leaves)
            w = rng.choice(sorted(store.holders(leaf)))
            for v in views:
                v.store.apply(w, [], [leaf])
        if rng.random() < 0.05:
            w = rng.randrange(len(ws))  # a worker loses its whole cache
            for v in views:
                v.store.drop_worker(w)
        # Counters, identical on both.
        keys = all_keys(store)
        for _ in range(rng.randint(0, 12)):
            if not keys:
                break
            k = rng.choice(keys)
            c = rng.choice((4, 8))
            if rng.random() < 0.5:
                amount = float(rng.randint(1, 6)) if rng.random() < 0.5 else rng.uniform(0, 6)
                kw = {"access": amount}
            else:
                kw = {"missed": rng.uniform(0, 2)}
            for m in (mgr, ref):
                m.record(k, c, **kw)
        if rng.random() < 0.3:
            full, want = mgr.candidates(views[0]), ref.candidates(views[1])
            for kind in ("inter", "intra", "reclaim"):
                _same(getattr(full, kind), getattr(want, kind), (seed, step, kind))
        got, exp = mgr.scan(views[0]), ref.scan(views[1])
        assert got.copies == exp.copies and got.reclaims == exp.reclaims, (seed, step)
        for kind in ("inter", "intra", "reclaim"):
            _same(getattr(got, kind), getattr(exp, kind), (seed, step, kind))
        assert got.tracked_nodes == exp.tracked_nodes, (seed, step)
        for op in got.copies + got.reclaims:
            assert store.block(op.key) is not None  # never a block that left
        # Some operations finish (the same ones on both).
        for m in (mgr, ref):
            ops: list[Copy | Reclaim] = [*m.copies_in_flight, *m.reclaims_in_flight]
            r2 = random.Random(seed * 1000 + step)
            for op in ops:
                if r2.random() < 0.5:
                    if isinstance(op, Copy):
                        m.copy_finished(op, installed=r2.random() < 0.5)
                    else:
                        m.reclaim_finished(op, deleted=r2.random() < 0.5)


@pytest.mark.parametrize("seed", range(40))
def test_scan_matches_full_reference(seed: int) -> None:
    _scenario(seed, wide_keys=False)


@pytest.mark.parametrize("batch", [1, 10**9])
@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_scan_matches_full_reference_lazy_and_plain(seed: int, batch: int) -> None:
    _scenario(seed, wide_keys=False, first_batch=batch)
    _scenario(1000 + seed % 6, wide_keys=True, first_batch=batch)


@pytest.mark.parametrize("seed", range(6))
def test_scan_matches_full_reference_with_keys_beyond_64_bits(seed: int) -> None:
    _scenario(1000 + seed, wide_keys=True)


@pytest.mark.parametrize("seed", range(0, 40, 5))
def test_scan_matches_full_reference_with_a_truncated_change_log(seed: int) -> None:
    """A change log of 1 or 3 entries: most scans find it truncated past their
    cursor and resynchronise (every tracked slot's generation against the
    store) instead of reading which blocks left."""
    _scenario(seed, wide_keys=False, log_limit=1 + 2 * (seed % 2))


@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_scan_matches_full_reference_mid_batches(seed: int) -> None:
    """First batches of 3 pairs: the selections cut inside ties (partition and
    counting paths of ``_lex_select``) and batch after batch, reclamation's
    dense selection partitions instead of taking a mass of ties."""
    _scenario(seed, wide_keys=False, first_batch=3)
    _scenario(1000 + seed % 6, wide_keys=True, first_batch=3)


def test_removed_blocks_leave_the_plan_and_come_back_fresh() -> None:
    ws = [WorkerState(id=i, degree=d, cache_capacity_blocks=10) for i, d in enumerate((4, 4, 8))]
    view = View(ws)
    s = CacheManagerSettings(
        theta_inter=0.5, theta_intra=2.0, theta_reclaim=1.0, max_copy_fraction=1.0
    )
    mgr = CacheManager(s, store=view.store)
    _, b = hold(view.store, 0, [1, 2])
    hold(view.store, 1, [1])
    mgr.record(2, 8, missed=5.0)
    mgr.record(2, 4, access=9.0)
    assert [c.key for c in mgr.candidates(view).inter] == [2]
    assert mgr.tracked[2].generation == b.generation
    view.store.apply(0, [], [2])  # block 2 leaves the index
    assert view.store.block(2) is None and mgr.counters(2) == ({}, {})
    plan = mgr.scan(view)
    assert plan.inter == [] and plan.intra == [] and not plan.copies
    assert 2 not in mgr.tracked and plan.tracked_nodes == 0
    # The key comes back: a new incarnation, with fresh counters.
    (b2,) = hold(view.store, 0, [1, 2])[1:]
    assert b2.generation != b.generation and mgr.counters(2) == ({}, {})
    mgr.record(2, 8, missed=1.0)
    assert mgr.counters(2) == ({}, {8: 1.0})
    assert mgr.tracked[2].generation == b2.generation


def test_a_key_back_before_the_scan_is_not_mixed_with_its_earlier_incarnation() -> None:
    """Block 2 leaves and comes back between two scans and is counted again
    before the table has read the change log: the slot of the old incarnation
    is given up (by generation), not reused."""
    view = View([WorkerState(id=0, degree=4, cache_capacity_blocks=10)])
    mgr = CacheManager(CacheManagerSettings(theta_intra=2.0), store=view.store)
    hold(view.store, 0, [1, 2])
    mgr.record(2, 4, access=9.0)
    view.store.apply(0, [], [2])
    hold(view.store, 0, [1, 2])
    assert mgr.counters(2) == ({}, {})
    mgr.record(2, 4, access=1.0)
    assert mgr.counters(2) == ({4: 1.0}, {}) and len(mgr.tracked) == 1
    mgr.scan(view)  # reads the log: the old incarnation's entry changes nothing
    assert mgr.counters(2) == ({4: pytest.approx(0.8)}, {})


def test_forgotten_in_place_blocks_give_their_slots_back() -> None:
    """Many blocks forgotten in place, then many new ones: slots are reused and the
    forgotten counters follow their blocks (lazily decayed) when touched again."""
    ws = [WorkerState(id=0, degree=4, cache_capacity_blocks=10)]
    view = View(ws)
    s = CacheManagerSettings(decay=0.5, theta_intra=4.0, counter_floor=0.05)
    mgr = CacheManager(s, store=view.store)
    first = list(range(1, 201))
    for k in first:
        hold(view.store, 0, [k])
        mgr.record(k, 4, access=0.25)
    mgr.scan(view)  # 0.25 < 0.05·4/0.5: all forgotten, counters now 0.125
    assert len(mgr.tracked) == 0
    second = list(range(1001, 1401))
    for k in second:
        hold(view.store, 0, [k])
        mgr.record(k, 4, access=3.0)
    assert len(mgr.tracked) == 400
    mgr.scan(view)
    assert mgr.counters(first[1])[0] == {4: pytest.approx(0.0625)}  # out of the table
    mgr.record(first[0], 4, access=1.0)
    assert mgr.counters(first[0])[0] == {4: pytest.approx(1.0625)}
    assert mgr.counters(second[0])[0] == {4: pytest.approx(1.5)}
    # Leaving the index drops the counters kept out of the table too.
    view.store.apply(0, [], [first[1]])
    hold(view.store, 0, [first[1]])
    mgr.scan(view)
    assert mgr.counters(first[1]) == ({}, {})
