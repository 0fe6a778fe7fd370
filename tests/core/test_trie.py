"""Global prefix trie built from cache events."""

import pytest

from vertumnus.core.blockcache import BlockCache
from vertumnus.core.trie import PrefixTrie


def test_holder_depths_per_worker():
    trie = PrefixTrie()
    trie.apply(0, [(1, None), (2, 1), (3, 2)], [])
    trie.apply(1, [(1, None), (2, 1)], [])
    trie.apply(2, [(9, None)], [])
    assert trie.matched_blocks([1, 2, 3, 4]) == {0: 3, 1: 2}
    assert trie.matched_blocks([1, 7]) == {0: 1, 1: 1}
    assert trie.matched_blocks([9]) == {2: 1}
    assert trie.matched_blocks([5]) == {}


def test_removal_prunes_unheld_leaves_upwards():
    trie = PrefixTrie()
    trie.apply(0, [(1, None), (2, 1), (3, 2)], [])
    trie.apply(1, [(1, None)], [])
    trie.removed(0, 3)
    trie.removed(0, 2)
    assert set(trie.nodes) == {1}
    trie.removed(0, 1)
    assert trie.matched_blocks([1]) == {1: 1}
    trie.removed(1, 1)
    assert len(trie) == 0 and not trie.roots


def test_out_of_order_store_is_an_error():
    with pytest.raises(ValueError, match="before its parent"):
        PrefixTrie().stored(0, 2, 1)


def test_trie_mirrors_worker_caches():
    caches = {0: BlockCache(3), 1: BlockCache(5)}
    trie = PrefixTrie()
    for w, path in [(0, [1, 2, 3]), (1, [1, 2]), (0, [4, 5]), (1, [1, 6, 7]), (0, [1, 2, 8])]:
        d = caches[w].insert(path)
        trie.apply(w, d.stored, d.removed)
    for w, cache in caches.items():
        held = {k for k, n in trie.nodes.items() if w in n.holders}
        assert held == set(cache.keys_lru_first())
