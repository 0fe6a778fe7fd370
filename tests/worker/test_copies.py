"""Copy planning, without ranks: destination geometry, missing blocks only, source fallback.

Workers are core Slots with ids unlike their first ranks, so nothing mixes ids and ranks.
"""

from __future__ import annotations

from vertumnus.core.lattice import Slot
from vertumnus.worker.blocks import Block
from vertumnus.worker.copies import plan_copy

KEYS = [100, 101, 102, 103, 104]


def holders(held: dict[int, set[int]], ranks) -> dict[int, list[bool]]:
    return {r: [j in held.get(r, set()) for j in range(len(KEYS))] for r in ranks}


def test_inter_degree_copy_is_repartitioned_to_the_destination():
    src, dst = Slot(20, 2, 0, 0), Slot(21, 4, 0, 4)  # CP2 -> CP4
    h = holders({0: {0, 2, 4}, 1: {1, 3}}, [0, 1, 4, 5, 6, 7])
    plan = plan_copy(KEYS, h, src, dst)
    assert plan.missing == [] and plan.skipped == 0
    assert plan.sends == {0: {4: [100, 104], 6: [102]}, 1: {5: [101], 7: [103]}}
    assert plan.receives == {  # each block with its parent, the key before it
        4: {0: [Block(100, 0, None), Block(104, 4, 103)]},
        6: {0: [Block(102, 2, 101)]},
        5: {1: [Block(101, 1, 100)]},
        7: {1: [Block(103, 3, 102)]},
    }


def test_blocks_the_destination_owner_holds_are_skipped():
    src, dst = Slot(30, 1, 0, 0), Slot(31, 1, 0, 1)
    plan = plan_copy(KEYS, holders({0: {0, 1, 2, 3, 4}, 1: {0, 1}}, [0, 1]), src, dst)
    assert plan.skipped == 2
    assert plan.sends == {0: {1: [102, 103, 104]}}


def test_a_block_held_off_its_owner_is_sent_from_where_it_is():
    # after CP4 -> 2xCP2, worker 2 (ranks 2, 3) holds positions 2, 3 mod 4 only;
    # position 0 sits on rank 2 under CP2 ownership, position 1 on rank 3.
    src, dst = Slot(41, 2, 0, 2), Slot(40, 2, 0, 0)
    h = holders({2: {2}, 3: {3}, 0: {0, 4}, 1: {1}}, [0, 1, 2, 3])
    plan = plan_copy(KEYS[:4], {r: v[:4] for r, v in h.items()}, src, dst)
    assert plan.sends == {2: {0: [102]}, 3: {1: [103]}} and plan.skipped == 2
    moved = plan_copy(KEYS[:2], holders({3: {0}, 2: set()}, [0, 1, 2, 3]), src, dst)
    assert moved.missing == [(1, 101)]  # nobody in the source holds position 1
    assert moved.sends == {3: {0: [100]}}  # position 0 from rank 3, though rank 2 owns it
