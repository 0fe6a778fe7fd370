"""The TrieStore contract, on exact small cases (every implementation, see conftest.py)."""

from __future__ import annotations

import pytest

from vertumnus.core.blockcache import BlockCache
from vertumnus.core.keys import chain_block_hashes
from vertumnus.core.store import StoreError, prefix_of

A = chain_block_hashes([1, 2, 3, 4])  # a 4-block prefix
B = chain_block_hashes([1, 2, 9])  # shares A's first two blocks


def chain(keys, upto=None):
    """(key, position, parent) for the first ``upto`` keys of a chain."""
    keys = keys[:upto]
    return [(k, i, keys[i - 1] if i else None) for i, k in enumerate(keys)]


def snapshot(store, keys):
    return (
        len(store),
        store.cursor,
        {k: sorted(store.holders(k)) for k in keys},
        {k: (b.depth, b.parent, b.generation) if (b := store.block(k)) else None for k in keys},
    )


def test_matches_each_workers_leading_blocks(make_store):
    s = make_store()
    s.apply(0, chain(A))
    s.apply(1, chain(B))
    s.apply(2, chain(A, 1))
    assert dict(s.matched_blocks(A)) == {0: 4, 1: 2, 2: 1}
    assert dict(s.matched_blocks(B)) == {0: 2, 1: 3, 2: 1}
    assert dict(s.matched_blocks(chain_block_hashes([7]))) == {}
    assert sorted(s.holders(A[1])) == [0, 1]
    assert sorted(s.workers()) == [0, 1, 2]
    assert sorted(s.worker_keys(1)) == sorted(B)
    assert len(s) == 5  # A's four blocks and B's third
    assert [b.key for b in s.path(A + (123,))] == list(A)
    assert s.block(A[3]).depth == 4 and s.block(A[3]).parent == A[2]
    assert sorted(s.children(A[1])) == sorted([A[2], B[2]])
    assert prefix_of(s, B[2]) == B


def test_a_worker_is_matched_only_up_to_its_first_missing_block(make_store):
    s = make_store()
    # Per-rank events of a CP2 worker: rank 0 owns even positions, rank 1 odd ones.
    s.apply(5, [(k, p, par) for k, p, par in chain(A) if p % 2 == 0])
    assert dict(s.matched_blocks(A)) == {5: 1}
    s.apply(5, [(k, p, par) for k, p, par in chain(A) if p % 2 == 1])
    assert dict(s.matched_blocks(A)) == {5: 4}
    # A worker that holds a deeper block only does not hold the prefix.
    s.apply(6, [(A[2], 2, A[1])])
    assert 6 not in s.matched_blocks(A)


def test_children_may_arrive_before_their_parents(make_store):
    s = make_store()
    s.apply(0, [(A[2], 2, A[1])])
    # The parent is known (from the child's event) but held by nobody yet.
    assert s.block(A[1]) is not None and not s.holders(A[1])
    assert dict(s.matched_blocks(A)) == {}
    s.apply(0, [(A[1], 1, None), (A[0], 0, None)])  # no parent reported for A[1]
    assert dict(s.matched_blocks(A)) == {0: 3}
    assert s.block(A[1]).depth == 2
    # The parent of A[1] is learnt when an event carries it.
    s.apply(1, [(A[1], 1, A[0])])
    assert s.block(A[1]).parent == A[0]
    assert prefix_of(s, A[2]) == A[:3]


def test_applying_a_batch_again_changes_nothing(make_store):
    s = make_store()
    s.apply(0, chain(A))
    before = snapshot(s, A)
    s.apply(0, chain(A))
    s.apply(0, list(reversed(chain(A))))
    assert snapshot(s, A) == before


def test_a_contradicting_batch_is_refused_whole(make_store):
    s = make_store()
    s.apply(0, chain(A))
    before = snapshot(s, A + B + (77,))
    with pytest.raises(StoreError, match=f"{A[3]:#x}.*position 1.*position 3"):
        s.apply(1, chain(B) + [(A[3], 1, A[0])])
    assert snapshot(s, A + B + (77,)) == before
    with pytest.raises(StoreError, match="position 0 cannot have a parent"):
        s.apply(1, [(B[2], 2, B[1]), (9, 0, 8)])
    with pytest.raises(StoreError, match="negative position"):
        s.apply(1, [(9, -1, None)])
    with pytest.raises(StoreError):
        s.apply(1, [(B[2], 2, A[2])])  # A[2] is at position 2, not 1
    with pytest.raises(StoreError):  # the batch contradicts itself
        s.apply(1, [(77, 3, None), (77, 4, None)])
    assert snapshot(s, A + B + (77,)) == before


def test_removals_and_pruning(make_store):
    s = make_store()
    s.apply(0, chain(A))
    s.apply(1, chain(A, 2))
    s.apply(0, removed=[A[3], A[2], 999])  # an unknown key is ignored
    assert len(s) == 2
    assert dict(s.matched_blocks(A)) == {0: 2, 1: 2}
    s.apply(0, removed=[A[0]])
    # Worker 0 lost the first block: nothing of A matches it any more.
    assert dict(s.matched_blocks(A)) == {1: 2}
    assert len(s) == 2  # A[1] still held by both
    s.apply(1, removed=[A[0], A[1]])
    s.apply(0, removed=[A[1]])
    assert len(s) == 0 and s.block(A[0]) is None


def test_a_parent_without_holders_stays_while_it_has_children(make_store):
    s = make_store()
    s.apply(0, chain(A, 3))
    s.apply(0, removed=[A[1]])
    assert s.block(A[1]) is not None and not s.holders(A[1])
    s.apply(0, removed=[A[2]])
    assert s.block(A[1]) is None and s.block(A[2]) is None


def test_clear_drops_the_workers_blocks_first(make_store):
    s = make_store()
    s.apply(0, chain(A))
    s.apply(1, chain(A, 1))
    s.apply(0, chain(B), cleared=True)
    assert dict(s.matched_blocks(A)) == {0: 2, 1: 1}
    assert dict(s.matched_blocks(B)) == {0: 3, 1: 1}
    assert s.block(A[3]) is None
    # After a clear a key may come back at another position (a new incarnation).
    s.apply(2, [(11, 0, None), (12, 1, 11)])
    s.apply(2, [(12, 0, None)], cleared=True)
    assert s.block(12).depth == 1 and s.block(11) is None


def test_drop_worker(make_store):
    s = make_store()
    s.apply(0, chain(A))
    s.apply(1, chain(B))
    s.drop_worker(0)
    assert dict(s.matched_blocks(A)) == {1: 2}
    assert sorted(s.workers()) == [1]
    assert len(s) == 3
    s.drop_worker(7)  # unknown: nothing happens
    assert len(s) == 3


def test_generation_changes_when_a_key_comes_back(make_store):
    s = make_store()
    s.apply(0, chain(A, 1))
    g = s.block(A[0]).generation
    s.apply(1, chain(A, 1))
    s.apply(0, removed=[A[0]])
    assert s.block(A[0]).generation == g  # still held by worker 1
    s.apply(1, removed=[A[0]])
    s.apply(0, chain(A, 1))
    assert s.block(A[0]).generation != g


def test_change_cursor(make_store):
    s = make_store(log_limit=4)
    c0 = s.cursor
    s.apply(0, chain(A, 2))
    s.apply(0, chain(A, 2))  # no change: no entry
    s.apply(1, chain(A, 1))
    s.apply(0, removed=[A[1]])
    cursor, changes = s.changes(c0)
    assert cursor == s.cursor == c0 + 3
    assert [(c.worker, c.stored, c.removed) for c in changes] == [
        (0, (A[0], A[1]), ()),
        (1, (A[0],), ()),
        (0, (), (A[1],)),
    ]
    gone = changes[-1].gone
    assert [k for k, _ in gone] == [A[1]]
    assert s.changes(cursor) == (cursor, [])
    s.drop_worker(0)
    s.drop_worker(1)
    _, last = s.changes(cursor)
    assert [c.dropped for c in last] == [True, True]
    assert {k for c in last for k, _ in c.gone} == {A[0]}
    # The log keeps 4 changes: a follower further behind must resynchronise.
    assert s.changes(c0)[1] is None


def test_namespace(make_store):
    a, b = make_store(), make_store()
    assert a.namespace != b.namespace
    a.apply(0, chain(A))
    assert len(b) == 0 and dict(b.matched_blocks(A)) == {}


def test_the_index_mirrors_worker_caches(make_store):
    """LRU caches' own deltas (parents first, evictions of leaves) keep it exact."""
    caches = {0: BlockCache(3), 1: BlockCache(5)}
    s = make_store()
    for w, path in [(0, [1, 2, 3]), (1, [1, 2]), (0, [4, 5]), (1, [1, 6, 7]), (0, [1, 2, 8])]:
        d = caches[w].insert(path)
        s.apply(w, d.stored, d.removed)
    for w, cache in caches.items():
        assert set(s.worker_keys(w)) == set(cache.keys_lru_first())


def test_a_first_block_never_names_a_parent(make_store):
    """Refused even when the key is already in the index (not only for a new key)."""
    s = make_store()
    s.apply(0, chain(A, 1))
    before = snapshot(s, A + (8,))
    with pytest.raises(StoreError, match="position 0 cannot have a parent"):
        s.apply(0, [(A[0], 0, 8)])
    assert snapshot(s, A + (8,)) == before


def test_a_refused_clear_leaves_the_workers_blocks(make_store):
    """A cleared batch refused by its later items leaves the clear undone too."""
    s = make_store()
    s.apply(1, [(B[2], 2, None)])  # B[2] is known, its parent is not
    s.apply(0, chain(A))
    before = snapshot(s, A + B + (77,))
    with pytest.raises(StoreError):  # two parents for B[2]
        s.apply(0, [(B[2], 2, B[1]), (B[2], 2, 77)], cleared=True)
    assert snapshot(s, A + B + (77,)) == before
    with pytest.raises(StoreError):  # A[0] as its own parent
        s.apply(0, [(A[0], 1, A[0])], cleared=True)
    assert snapshot(s, A + B + (77,)) == before
