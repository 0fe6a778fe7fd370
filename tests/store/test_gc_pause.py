"""What Python's cyclic collector walks in a process holding a prefix index
(``bench/gc_pause.py``, ``vertumnus.core._trienode``)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from tests.conftest import bench_script
from vertumnus.core import trie, trienode
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.trienode import python_nodes


def grown_objects(blocks: int) -> tuple[int, int]:
    """(blocks in the index, objects the collector tracks more once it is built)."""
    b = bench_script("gc_pause.py")
    gc.collect()
    before = len(gc.get_objects())
    pool, prefixes = b.placement_speed.build(64, blocks, 0)
    gc.collect()
    grown = len(gc.get_objects()) - before
    size = len(pool.store)
    del pool, prefixes
    return size, grown


def test_the_compiled_node_is_built_and_in_use():
    """Optional at install time, but this project's build (and CI) has a compiler:
    a silent fall-back would bring back the router's quarter-second pauses."""
    assert trie.UNTRACKED
    assert trie.TrieNode is not trienode.TrieNode


def test_the_index_adds_nothing_to_the_collectors_walks():
    """Nodes, their sets and the change log are out of the walk, so a full collection
    costs the same with 20,000 blocks as with none (a few objects of the bench itself)."""
    blocks, grown = grown_objects(20_000)
    assert blocks > 19_000
    assert grown < 200


def test_the_python_node_costs_two_objects_per_block_not_three():
    """Without the compiled node: a node and its set of holders; its children are a key
    alone where there is one (most blocks), not one more set. The change log adds one
    object per logged change (a few per conversation)."""
    with python_nodes():
        blocks, grown = grown_objects(20_000)
    assert 2 * blocks <= grown < 2.2 * blocks


def test_a_churning_index_brings_no_full_collection():
    """5,000 blocks stored and evicted 4 times over: nothing the churn keeps survives
    into the oldest generation, so the interpreter has no reason to walk it."""
    b = bench_script("gc_pause.py")
    got = b.churn("default", 5_000, 20_000)
    # The index keeps its size while it churns (a conversation in, the oldest out).
    assert got["blocks"] == pytest.approx(5_000, rel=0.05)
    assert got["stored_blocks"] == 20_000
    assert got["full_collections"] == 0
    assert got["total_ms"] == got["longest_ms"] == 0.0


def test_untracked_blocks_are_freed_when_they_leave_the_index():
    """Out of the collector's walk, a dropped block is freed by reference counting
    alone: filling and emptying the index again leaves nothing behind."""
    chains = [
        [(k << 8 | i, i, (k << 8 | i - 1) if i else None) for i in range(20)] for k in range(500)
    ]
    store = PrefixTrie(log_limit=1)  # the log keeps one change, not what it names
    emptied: list[int] = []
    tracemalloc.start()
    try:
        for _ in range(4):
            for k, chain in enumerate(chains):
                store.apply(k % 8, chain)
            filled = tracemalloc.get_traced_memory()[0]
            for w in range(8):
                store.drop_worker(w)
            assert len(store) == 0
            emptied.append(tracemalloc.get_traced_memory()[0])
            # The 10,000 nodes and their sets go; the dict keeps its table.
            assert filled - emptied[-1] > 1_000_000
    finally:
        tracemalloc.stop()
    # A leak of the nodes would add over a megabyte a round; what moves is the
    # dict's table (deleted entries are reused or compacted later).
    assert max(emptied) - min(emptied) < 400_000, emptied


def test_the_compiled_node_behaves_as_the_python_one():
    for make in (trie.TrieNode, trienode.TrieNode):
        node = make(7, 2, 3, 11)
        assert (node.key, node.depth, node.parent, node.generation) == (7, 2, 3, 11)
        assert node.children is None and node.holders == set()
        node.holders.add(5)
        node.holders.add(2)
        node.children = 9
        node.parent = None
        assert (node.children, node.parent) == (9, None)
        assert repr(node) == "TrieNode(depth=2, holders=[2, 5])"
        del node.holders
        with pytest.raises(AttributeError, match="holders"):
            repr(node)
        with pytest.raises(AttributeError):
            node.other = 1  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            make(7, 2, 3)  # type: ignore[call-arg]
    compiled = trie.TrieNode(1, 1, None, 1)
    assert not gc.is_tracked(compiled) and not gc.is_tracked(compiled.holders)


def test_freeze_is_undone_after_a_run():
    b = bench_script("gc_pause.py")
    b.churn("freeze", 2_000, 1_000)
    assert gc.get_freeze_count() == 0


def test_bad_sizes_are_refused_by_name(capsys):
    b = bench_script("gc_pause.py")
    with pytest.raises(SystemExit):
        b.main(["--blocks", "10"])
    assert "--blocks" in capsys.readouterr().err


def test_both_nodes_side_by_side(capsys):
    b = bench_script("gc_pause.py")
    assert b.main(["--blocks", "2000", "--churn", "100", "--mode", "default"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[:2] for r in rows] == [["compiled", "default"], ["python", "default"]]
    # The Python node's index is walked by the collector; the compiled one's is not.
    tracked = [int(r.split(", ")[1].split()[0].replace(",", "")) for r in rows]
    assert tracked[1] - tracked[0] > 2 * 2000
    assert trie.TrieNode is not trienode.TrieNode  # the swap was undone
