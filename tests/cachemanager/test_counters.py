"""Per-request counter updates, marginal benefit and lazy decay, by hand."""

from __future__ import annotations

import pytest

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings, marginal_benefits
from vertumnus.core.types import Request

from .helpers import MODEL, View, hold, placed, workers

A, B, C, D, X = 0xA, 0xB, 0xC, 0xD, 0xF


def test_marginal_benefits_by_hand() -> None:
    # L = 10 tokens, 4-token blocks: cached prefixes 0, 4, 8 and 9 (the last
    # token is always computed). E_4 at those: 0.15875, 0.13825, 0.11375, 0.107.
    got = marginal_benefits(MODEL, 4, 10, 4, 0, 3)
    assert got == pytest.approx([0.0205, 0.0245, 0.00675])
    assert marginal_benefits(MODEL, 4, 10, 4, 1, 3) == pytest.approx([0.0245, 0.00675])


def test_observe_request_access_on_reused_path_missed_beyond_preferred_degree() -> None:
    view = View(workers(4, 4, 8))
    hold(view.store, 0, [A, B, C])
    hold(view.store, 1, [A])
    hold(view.store, 2, [A])
    mgr = CacheManager()
    # 14 tokens in 4 blocks; X is not in the index, so MatchedPath = A, B, C.
    req = Request(id=7, arrival_s=0.0, length=14, block_keys=(A, B, C, X))
    mgr.observe_request(req, placed(1, 8), view)
    # Reused at worker 1 (CP4): A only.
    assert mgr.counters(A) == ({4: 1.0}, {})
    # CP8 (worker 2) holds A, so missed[., 8] starts at B. E_8 with reuse
    # ending at depth 1, 2, 3: 0.244375, 0.228125, 0.209875.
    access_b, missed_b = mgr.counters(B)
    access_c, missed_c = mgr.counters(C)
    assert access_b == {} and access_c == {}
    assert missed_b == {8: pytest.approx(0.01625)}
    assert missed_c == {8: pytest.approx(0.01825)}
    assert mgr.in_use(1, A) and not mgr.in_use(0, A)
    mgr.request_done(7)
    assert not mgr.in_use(1, A)


def test_no_missed_when_preferred_degree_holds_the_whole_path() -> None:
    view = View(workers(4, 8))
    hold(view.store, 0, [A, B])
    hold(view.store, 1, [A, B])
    mgr = CacheManager()
    mgr.observe_request(Request(1, 0.0, 12, (A, B, C)), placed(0, 8), view)
    assert mgr.counters(B) == ({4: 1.0}, {})


def test_no_missed_without_a_preferred_degree() -> None:
    view = View(workers(4, 8))
    hold(view.store, 0, [A, B])
    mgr = CacheManager()
    mgr.observe_request(Request(1, 0.0, 12, (A, B, C)), placed(0, 0), view)
    assert mgr.counters(A) == ({4: 1.0}, {}) and mgr.counters(B) == ({4: 1.0}, {})


def test_replacement_moves_pins() -> None:
    view = View(workers(4, 4))
    hold(view.store, 0, [A])
    hold(view.store, 1, [A])
    mgr = CacheManager()
    req = Request(3, 0.0, 8, (A, B))
    mgr.observe_request(req, placed(0, 4), view)
    mgr.observe_request(req, placed(1, 4), view)  # re-placed (drain)
    assert not mgr.in_use(0, A) and mgr.in_use(1, A)


def test_lazy_decay_and_forgetting() -> None:
    view = View(workers(4, 4))
    hold(view.store, 0, [A])
    mgr = CacheManager(
        CacheManagerSettings(decay=0.5, theta_intra=4.0, counter_floor=0.05), store=view.store
    )
    mgr.record(A, 4, access=8.0)
    mgr.scan(view)
    assert mgr.counters(A)[0] == {4: pytest.approx(4.0)}
    mgr.scan(view)
    assert mgr.counters(A)[0] == {4: pytest.approx(2.0)}
    mgr.record(A, 4, access=1.0)  # brought up to date, then added
    assert mgr.tracked[A].access == {4: pytest.approx(3.0)} and mgr.epoch == 2
    # Forgotten once below counter_floor·θ_intra = 0.2 after a scan's decay:
    # 3 → 1.5 → 0.75 → 0.375 → 0.1875 (dropped in the scan that brings it there).
    for _ in range(3):
        mgr.scan(view)
        assert A in mgr.tracked
    mgr.scan(view)
    assert A not in mgr.tracked
    assert mgr.counters(A)[0] == {4: pytest.approx(0.1875)}  # still answered, decayed
    mgr.record(A, 4, access=1.0)
    assert A in mgr.tracked
    assert mgr.counters(A)[0] == {4: pytest.approx(1.1875)}


def test_record_needs_a_block_of_the_store() -> None:
    view = View(workers(4))
    mgr = CacheManager()
    with pytest.raises(RuntimeError, match="no store"):
        mgr.record(A, 4, access=1.0)
    mgr = CacheManager(store=view.store)
    with pytest.raises(KeyError):
        mgr.record(A, 4, access=1.0)
    assert mgr.counters(A) == ({}, {})


def test_a_view_over_another_store_starts_afresh() -> None:
    view, other = View(workers(4)), View(workers(4))
    for v in (view, other):
        hold(v.store, 0, [A])
    mgr = CacheManager(store=view.store)
    mgr.record(A, 4, access=3.0)
    mgr.scan(other)
    assert mgr.counters(A) == ({}, {}) and len(mgr.tracked) == 0


def test_settings_validate() -> None:
    with pytest.raises(ValueError, match="theta_reclaim"):
        CacheManagerSettings(theta_intra=1.0, theta_reclaim=1.0)
    with pytest.raises(ValueError, match="decay"):
        CacheManagerSettings(decay=1.0)
    with pytest.raises(ValueError, match="first_batch"):
        CacheManager(first_batch=0)
