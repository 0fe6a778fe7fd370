"""Worker-local LRU prefix cache: exact eviction order on tiny configs."""

from hypothesis import given
from hypothesis import strategies as st

from vertumnus.core.blockcache import BlockCache


def test_lru_evicts_leaves_in_order():
    cache = BlockCache(4)
    d1 = cache.insert([1, 2, 3])
    assert d1.stored == [(1, 0, None), (2, 1, 1), (3, 2, 2)] and d1.removed == []
    d2 = cache.insert([1, 4])  # shares block 1, adds 4
    assert d2.stored == [(4, 1, 1)] and d2.removed == []
    assert cache.keys_lru_first() == [3, 2, 4, 1]
    d3 = cache.insert([5])
    assert d3.removed == [3]  # the oldest leaf, never its parent 2
    d4 = cache.insert([6])
    assert d4.removed == [2]  # 2 became a leaf once 3 left
    assert sorted(cache.keys_lru_first()) == [1, 4, 5, 6]


def test_match_counts_leading_blocks_only():
    cache = BlockCache(10)
    cache.insert([1, 2, 3])
    assert cache.match([1, 2, 3, 4]) == 3
    assert cache.match([1, 9, 3]) == 1
    assert cache.match([7]) == 0


def test_touch_refreshes_a_shared_prefix():
    cache = BlockCache(3)
    cache.insert([1, 2])
    cache.insert([3])
    cache.touch([1, 2], 2)  # 1 and 2 now more recent than 3
    assert cache.insert([4]).removed == [3]


def test_path_longer_than_capacity_is_truncated():
    cache = BlockCache(2)
    d = cache.insert([1, 2, 3])
    assert [k for k, _, _ in d.stored] == [1, 2]
    assert len(cache) == 2


def test_zero_capacity_caches_nothing():
    cache = BlockCache(0)
    assert not cache.insert([1, 2])
    assert len(cache) == 0


def test_remove_subtree():
    cache = BlockCache(10)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    cache.insert([1, 5])
    d = cache.remove_subtree(2)
    assert sorted(d.removed) == [2, 3, 4]
    assert d.removed.index(3) < d.removed.index(2) and d.removed.index(4) < d.removed.index(2)
    assert sorted(cache.keys_lru_first()) == [1, 5]


paths = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=1, max_size=40)


@given(paths, st.integers(1, 12))
def test_cache_is_always_prefix_closed(raw_paths, capacity):
    # every cached block's parent is cached too: eviction never strands a block
    cache = BlockCache(capacity)
    for raw in raw_paths:
        keys, prev = [], 0
        for h in raw:  # chained keys: a tuple of the whole prefix
            prev = hash((prev, h))
            keys.append(prev)
        cache.insert(keys)
        assert len(cache) <= capacity
        for key, parent in cache._lru.items():
            assert parent is None or parent in cache, (key, parent)


def test_prefixes_are_root_to_leaf_paths_least_recent_first():
    c = BlockCache(10)
    c.insert([1, 2, 3])
    c.insert([1, 4])
    c.insert([5])
    assert c.prefixes() == [(1, 2, 3), (1, 4), (5,)]
    c.touch([1, 2, 3], 3)
    assert c.prefixes() == [(1, 4), (5,), (1, 2, 3)]
