"""The per-rank paged KV cache: exact slots, LRU order, parents, events."""

from __future__ import annotations

import torch

from vertumnus.worker.blocks import Block, block_keys, block_owner
from vertumnus.worker.kv_cache import CacheEvent, PagedKVCache


def _cache(num_blocks=4):
    return PagedKVCache(
        num_blocks=num_blocks,
        block_size=2,
        layers=1,
        kv_heads=1,
        head_dim=2,
        dtype=torch.float64,
        rank=3,
    )


def _store(cache, keys, first_position=0):
    """Store ``keys`` as one chain: each block's parent is the key before it."""
    slots = cache.reserve(len(keys))
    parents = [None if first_position == 0 else -1, *keys[:-1]]
    blocks = [
        Block(k, first_position + i, p) for i, (k, p) in enumerate(zip(keys, parents, strict=True))
    ]
    cache.commit(list(zip(blocks, slots, strict=False)))
    return slots


def test_reserve_takes_free_slots_in_order_then_evicts_lru():
    cache = _cache()
    assert _store(cache, [10, 11, 12]) == [0, 1, 2]
    cache.touch([10, 11, 12])  # head most recent, tail least
    assert cache.lru_order() == [12, 11, 10]
    assert _store(cache, [20, 21]) == [3, 2]  # one free slot, then evicts 12 (the tail)
    assert 12 not in cache and len(cache) == 4
    assert cache.drain_events() == [
        CacheEvent("stored", (10, 11, 12), (0, 1, 2), (None, 10, 11), 3),
        CacheEvent("removed", (12,), (2,), (11,), 3),
        CacheEvent("stored", (20, 21), (0, 1), (None, 20), 3),
    ]
    assert cache.drain_events() == []
    assert sorted(cache.blocks()) == [
        Block(10, 0, None),
        Block(11, 1, 10),
        Block(20, 0, None),
        Block(21, 1, 20),
    ]


def test_protected_blocks_are_not_evicted():
    cache = _cache(num_blocks=2)
    _store(cache, [1, 2])
    assert cache.reserve(2, protect=[1, 2]) == []
    assert cache.reserve(1, protect=[1]) == [1]  # evicts 2
    assert cache.keys() == [1]


def test_insert_read_evict_round_trip():
    cache = _cache()
    data = torch.arange(2 * 8, dtype=torch.float64).reshape(2, 1, 2, 2, 1, 2)
    assert cache.insert([Block(5, 0, None), Block(6, 1, 5)], data) == 2
    assert torch.equal(cache.read([5, 6]), data)
    assert cache.insert([Block(5, 0, None)], data[:1]) == 0  # already present
    assert cache.evict([6, 99]) == [6]
    assert cache.keys() == [5]
    assert cache.drain_events()[-1] == CacheEvent("removed", (6,), (1,), (5,), 3)


def test_clear_frees_every_slot_with_one_event():
    cache = _cache()
    _store(cache, [1, 2, 3])
    cache.drain_events()
    assert cache.clear() == 3 and len(cache) == 0
    assert cache.drain_events() == [CacheEvent("cleared", (), (), (), 3)]
    assert sorted(_store(cache, [7, 8, 9, 10])) == [0, 1, 2, 3]  # all four slots are free again


def test_block_keys_chain_and_skip_partial_tail():
    a = block_keys([1, 2, 3, 4, 5], 2)
    b = block_keys([1, 2, 3, 9], 2)
    assert len(a) == 2 and len(b) == 2
    assert a[0] == b[0] and a[1] != b[1]
    assert block_keys([9, 9, 1, 2], 2)[1] != a[0]  # same block content, other prefix
    assert [block_owner(j, 4) for j in range(6)] == [0, 1, 2, 3, 0, 1]
