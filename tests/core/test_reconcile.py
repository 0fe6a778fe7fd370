"""Reconciliation plans after a split or a merge (design.md section 5)."""

from __future__ import annotations

from vertumnus.core.reconcile import plan_merge, plan_split


def test_split_deals_recent_prefixes_first_to_the_least_loaded_child():
    prefixes = [(1, 2), (1, 3), (4,), (5, 6, 7)]  # least recently used first
    plan = plan_split(prefixes, (10, 11), capacity_blocks=4)
    # Most recent first: (5,6,7) to 10, (4,) to 11 (less demand), (1,3) to 11,
    # (1,2): 11 has 3 blocks + 1 new = 4 <= 4, and less demand than 10.
    assert plan.prefixes[10] == ((5, 6, 7),)
    assert plan.prefixes[11] == ((1, 2), (1, 3), (4,))
    # Every block a child gets is pending, with the sibling as the source.
    assert plan.pending[10] == {5: 11, 6: 11, 7: 11}
    assert plan.pending[11] == {1: 10, 2: 10, 3: 10, 4: 10}


def test_split_drops_what_fits_neither_child():
    plan = plan_split([(1, 2, 3)], (10, 11), capacity_blocks=2)
    assert plan.prefixes == {10: (), 11: ()}


def test_merge_interleaves_and_marks_blocks_held_by_one_source_pending():
    a = [(1, 2), (3,)]
    b = [(1, 2, 9)]
    plan = plan_merge(a, b, (0, 1), 5, pending_a={3: 1}, pending_b={})
    assert plan.prefixes[5] == ((1, 2), (1, 2, 9), (3,))
    # 1, 2 held by both: complete. 9 only in b: pending on the merged ranks.
    # 3 was pending at a from its buddy b: now on the merged worker's own ranks.
    assert plan.pending[5] == {9: 5, 3: 5}


def test_merge_keeps_a_pending_source_outside_the_pair():
    plan = plan_merge([(1,)], [], (0, 1), 5, pending_a={1: 7})
    assert plan.pending[5] == {1: 7}
