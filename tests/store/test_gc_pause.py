"""``bench/gc_pause.py``: what the cyclic collector walks in a process holding a prefix index."""

from __future__ import annotations

import gc

import pytest

from tests.conftest import bench_script


def test_every_block_of_the_index_is_two_objects_the_collector_walks():
    b = bench_script("gc_pause.py")
    got = b.churn("default", 5_000, 20_000)
    # The index keeps its size while it churns (a conversation in, the oldest out).
    assert got["blocks"] == pytest.approx(5_000, rel=0.05)
    assert got["stored_blocks"] == 20_000
    assert got["tracked_objects"] >= 2 * got["blocks"]
    assert got["full_collections"] >= 0 and got["total_ms"] >= got["longest_ms"] >= 0.0


def test_a_block_costs_the_collector_two_objects_not_three():
    """A TrieNode and its set of holders; its children are a key alone where there is
    one (most blocks), not one more set."""
    b = bench_script("gc_pause.py")
    gc.collect()
    before = len(gc.get_objects())
    pool, prefixes = b.placement_speed.build(64, 20_000, 0)
    gc.collect()
    grown = len(gc.get_objects()) - before
    blocks = len(pool.store)
    assert 2 * blocks <= grown < 2.2 * blocks
    del pool, prefixes


def test_freeze_is_undone_after_a_run():
    b = bench_script("gc_pause.py")
    b.churn("freeze", 2_000, 1_000)
    assert gc.get_freeze_count() == 0


def test_bad_sizes_are_refused_by_name(capsys):
    b = bench_script("gc_pause.py")
    with pytest.raises(SystemExit):
        b.main(["--blocks", "10"])
    assert "--blocks" in capsys.readouterr().err
