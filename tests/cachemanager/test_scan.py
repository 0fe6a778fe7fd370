"""Scan decisions on a hand-built index: exact candidate lists, rankings and operations.

Trie (keys root first) and holders, workers 0 and 1 CP4, worker 2 CP8:

    A ── B ── C        A: 0, 1, 2     B: 0     C: 0
    └─── D             D: 1
"""

from __future__ import annotations

import pytest

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings, Copy, Reclaim
from vertumnus.core.types import Request

from .helpers import View, hold, placed, workers

A, B, C, D, E = 0xA, 0xB, 0xC, 0xD, 0xE

SETTINGS = CacheManagerSettings(
    theta_inter=1.0,
    theta_intra=4.0,
    theta_reclaim=1.0,
    tie_tolerance=0.25,
    max_copy_fraction=1.0,
    kv_bytes_per_token=1000,
    link_bandwidth_bytes_per_s=1e6,
    transfer_latency_s=0.01,
    reclaim_for_room_only=False,  # the paper's rule read literally; gating tested below
)


def pool() -> View:
    view = View(workers(4, 4, 8))
    hold(view.store, 0, [A, B, C])
    hold(view.store, 1, [A, D])
    hold(view.store, 2, [A])
    return view


def ranked(cands: list) -> list[tuple]:
    return [(c.kind, c.key, c.degree, c.replicas, round(c.score, 6), c.footprint) for c in cands]


def test_candidate_lists_and_rankings() -> None:
    view = pool()
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(C, 8, missed=3.0)  # r=0 at CP8; worker 2 lacks B, C → 2 blocks
    mgr.record(D, 8, missed=1.5)  # r=0 at CP8; 1 block
    mgr.record(B, 8, missed=0.5)  # below θ_inter
    mgr.record(A, 4, access=10.0)  # r=2 > ... but every CP4 worker holds A: no destination
    mgr.record(B, 4, access=4.9)  # r=1, band ⌊ln 4.9 / ln 1.25⌋ = 7, footprint 1
    mgr.record(C, 4, access=5.0)  # r=1, band 7, footprint 2
    mgr.record(D, 4, access=4.6)  # r=1, band 6, footprint 1
    plan = mgr.candidates(view)
    # Inter: equal missed per block (1.5); the smaller footprint wins.
    assert ranked(plan.inter) == [("inter", D, 8, 0, 1.5, 1), ("inter", C, 8, 0, 1.5, 2)]
    # Intra: B and C are near-ties (same band) so B's smaller footprint
    # puts it ahead of C's higher access; D is a band lower.
    assert ranked(plan.intra) == [
        ("intra", B, 4, 1, 4.9, 1),
        ("intra", C, 4, 1, 5.0, 2),
        ("intra", D, 4, 1, 4.6, 1),
    ]
    # A at CP4 has r = 2 and access 10 ≥ 2·θ_reclaim; nothing else has r ≥ 2.
    assert plan.reclaim == []


def test_plan_operations_merge_paths_and_respect_bounds() -> None:
    view = pool()
    view.workers[1].outstanding_s = 5.0
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(C, 8, missed=3.0)
    mgr.record(D, 8, missed=1.5)
    mgr.record(B, 4, access=4.9)
    mgr.record(C, 4, access=5.0)
    mgr.record(D, 4, access=4.6)
    plan = mgr.scan(view)
    # 4-token blocks × 1000 B/token at 1 MB/s per rank, min(C_src, C_dst) ranks.
    assert plan.copies == [
        # inter D→CP8: source = any holder (worker 1), 1 missing block, 4 ranks.
        Copy("inter", D, 8, 1, 2, (A, D), 1, pytest.approx(0.01 + 4000 / 4e6)),
        # inter C→CP8: only worker 0 holds C.
        Copy("inter", C, 8, 0, 2, (A, B, C), 2, pytest.approx(0.01 + 8000 / 4e6)),
        # intra B→worker 1 extended by C (on the same path) into one copy of 2 blocks.
        Copy("intra", C, 4, 0, 1, (A, B, C), 2, pytest.approx(0.01 + 8000 / 4e6)),
        # intra D→worker 0.
        Copy("intra", D, 4, 1, 0, (A, D), 1, pytest.approx(0.01 + 4000 / 4e6)),
    ]
    assert mgr.counts["inter_started"] == 2 and mgr.counts["intra_started"] == 2
    # In flight: not candidates again, and nothing visible in the index yet.
    again = mgr.candidates(view)
    assert again.inter == [] and again.intra == []
    assert 2 not in view.store.holders(C)
    bounded = CacheManager(
        CacheManagerSettings(
            **{**SETTINGS.__dict__, "max_inter_per_scan": 1, "max_intra_per_scan": 0}
        ),
        store=view.store,
    )
    bounded.record(C, 8, missed=3.0)
    bounded.record(D, 8, missed=1.5)
    bounded.record(B, 4, access=4.9)
    assert [(op.kind, op.key) for op in bounded.scan(view).copies] == [("inter", D)]


def test_copy_finished_releases_the_candidate() -> None:
    view = pool()
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(D, 8, missed=3.0)  # 1.5 after the scan's decay: still above θ_inter
    (op,) = mgr.scan(view).copies
    assert mgr.candidates(view).inter == []
    mgr.copy_finished(op, installed=False)
    assert [c.key for c in mgr.candidates(view).inter] == [D]
    assert mgr.counts["copies_failed"] == 1


def reclaim_pool() -> View:
    """Workers 0 and 1 (CP4) hold A-B, worker 0 also A-E; worker 2 (CP8) holds A."""
    view = View(workers(4, 4, 8))
    hold(view.store, 0, [A, B])
    hold(view.store, 0, [A, E])
    hold(view.store, 1, [A, B])
    hold(view.store, 2, [A])
    view.workers[0].cache_used_blocks = 50
    view.workers[1].cache_used_blocks = 90  # more cache pressure
    return view


def test_reclaim_ranking_and_leaf_first_selection() -> None:
    view = reclaim_pool()
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(B, 4, access=0.5)  # r = 2: 0.25 per replica
    mgr.record(A, 4, access=1.5)  # r = 2: 0.75 per replica
    mgr.record(E, 4, access=0.1)  # r = 1: never (reclaim_min_replicas = 2)
    mgr.record(A, 8, access=0.0, missed=0.0)
    plan = mgr.candidates(view)
    assert ranked(plan.reclaim) == [("reclaim", B, 4, 2, 0.25, 0), ("reclaim", A, 4, 2, 0.75, 0)]
    plan = mgr.scan(view)
    # B goes at the fuller worker 1; then A at worker 1 is a leaf (its child B
    # is reclaimed in this plan). A at worker 0 would strand B and E there.
    assert plan.reclaims == [Reclaim(B, 4, 1), Reclaim(A, 4, 1)]
    # Metadata untouched until the deletions are confirmed.
    assert 1 in view.store.holders(B) and 1 in view.store.holders(A)


def test_no_reclaim_of_a_replica_in_use() -> None:
    view = reclaim_pool()
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(B, 4, access=0.5)
    mgr.record(A, 4, access=1.5)
    # A request queued at worker 1 reuses A-B there.
    mgr.observe_request(Request(9, 0.0, 12, (A, B, 0x99)), placed(1, 4), view)
    # That request also counted: access[A,4] = 2.5, access[B,4] = 1.5 → both still < r·θ_reclaim = 2? B yes, A no.
    plan = mgr.scan(view)
    # B at worker 0 instead; A stays: at worker 1 it is in use, at worker 0 it
    # is not a leaf (E remains).
    assert plan.reclaims == [Reclaim(B, 4, 0)]
    mgr.request_done(9)
    assert not mgr.in_use(1, B)


def test_reclaim_keeps_a_degrees_last_copy_by_default() -> None:
    view = View(workers(4, 8))
    hold(view.store, 0, [A])
    hold(view.store, 1, [A])
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(A, 4, access=0.1)
    assert mgr.candidates(view).reclaim == []
    lenient = CacheManager(
        CacheManagerSettings(**{**SETTINGS.__dict__, "reclaim_min_replicas": 1}), store=view.store
    )
    lenient.record(A, 4, access=0.1)
    # Equal depth and key: access/r decides (0.0 at CP8 before 0.1 at CP4).
    assert [(c.key, c.degree) for c in lenient.candidates(view).reclaim] == [(A, 8), (A, 4)]


def test_reconfiguration_drops_operations_and_pins_of_removed_workers() -> None:
    view = pool()
    mgr = CacheManager(SETTINGS, store=view.store)
    mgr.record(D, 8, missed=3.0)  # copy D: worker 1 → worker 2
    mgr.observe_request(Request(5, 0.0, 8, (A, D)), placed(1, 4), view)
    (op,) = mgr.scan(view).copies
    assert (op.source, op.destination) == (1, 2) and mgr.in_use(1, A)
    assert mgr.workers_removed([1]) == [op]
    assert mgr.copies_in_flight == [] and not mgr.in_use(1, A)
    assert mgr.counts["copies_failed"] == 1


def test_reclaim_only_where_incoming_copies_need_room() -> None:
    view = reclaim_pool()
    gated = CacheManagerSettings(**{**SETTINGS.__dict__, "reclaim_for_room_only": True})
    mgr = CacheManager(gated, store=view.store)
    mgr.record(B, 4, access=0.5)
    mgr.record(A, 4, access=1.5)
    # Nothing is being copied: nothing needs room, nothing is reclaimed.
    plan = mgr.scan(view)
    assert [c.key for c in plan.reclaim] == [B, A] and plan.reclaims == []
    # Worker 0 (50 of 100 blocks used) receives a 60-block copy: 10 blocks short.
    mgr = CacheManager(gated, store=view.store)
    mgr.record(B, 4, access=0.5)
    mgr.record(E, 8, missed=5.0)  # an inter copy of A-E to worker 2 (CP8)
    view.workers[2].cache_used_blocks = 100
    view.workers[2].cache_capacity_blocks = 100
    (copy,) = mgr.scan(view).copies
    assert copy.destination == 2 and copy.missing_blocks == 1
    # Worker 2 needs 1 block but holds only A, whose r at CP8 is 1: nothing to
    # reclaim there; workers 0 and 1 receive nothing, so B stays everywhere.
    assert mgr.reclaims_in_flight == []
    # Worker 1 (full) receives an intra copy of A-E (1 block): exactly one
    # block is reclaimed there — B, the coldest leaf; worker 0 needs no room.
    view = reclaim_pool()
    view.workers[1].cache_used_blocks = view.workers[1].cache_capacity_blocks
    mgr = CacheManager(gated, store=view.store)
    mgr.record(E, 4, access=10.0)
    mgr.record(B, 4, access=0.5)
    plan = mgr.scan(view)
    assert [(op.kind, op.key, op.destination, op.missing_blocks) for op in plan.copies] == [
        ("intra", E, 1, 1)
    ]
    assert plan.reclaims == [Reclaim(B, 4, 1)]
