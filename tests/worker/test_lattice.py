"""The lattice of aligned groups, and the groupings an engine accepts (core Slots or degrees)."""

from __future__ import annotations

import pytest

from vertumnus.core.lattice import Slot
from vertumnus.worker.lattice import default_grouping, engine_grouping, lattice_groups


def test_lattice_of_8_ranks_in_creation_order():
    assert lattice_groups(8) == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
        range(6, 8),
        range(0, 4),
        range(4, 8),
        range(0, 8),
    ]
    assert lattice_groups(1) == []


def test_degrees_lay_workers_out_left_to_right_with_default_ids():
    assert default_grouping([2, 2, 4], 8) == [Slot(0, 2, 0, 0), Slot(2, 2, 0, 2), Slot(4, 4, 0, 4)]
    assert engine_grouping([4, 2, 1, 1], 8) == [
        Slot(0, 4, 0, 0),
        Slot(4, 2, 0, 4),
        Slot(6, 1, 0, 6),
        Slot(7, 1, 0, 7),
    ]


def test_slots_keep_their_ids_and_come_back_by_offset():
    slots = [Slot(12, 2, 0, 2), Slot(11, 2, 0, 0)]
    assert engine_grouping(slots, 4) == [Slot(11, 2, 0, 0), Slot(12, 2, 0, 2)]


@pytest.mark.parametrize(
    ("grouping", "world", "message"),
    [
        ([2, 4, 2], 8, "a CP4 worker cannot start at rank 2"),
        ([3, 1], 4, "worker degree 3 is not a power of two"),
        ([2], 4, "cover 2 ranks, the pool has 4"),
        ([], 4, "at least one worker"),
        ([Slot(1, 2, 0, 0), Slot(1, 2, 0, 2)], 4, "worker ids repeat"),
        (
            [Slot(5, 2, 0, 1), Slot(6, 1, 0, 0), Slot(7, 1, 0, 3)],
            4,
            "worker 5: a CP2 worker cannot start at rank 1",
        ),
        ([Slot(5, 2, 0, 0)], 4, r"ranks \[2, 3\] are in no worker"),
        ([Slot(5, 4, 0, 0), Slot(6, 2, 0, 2)], 4, "workers 5 and 6 both use rank 2"),
        ([Slot(5, 4, 1, 0)], 4, r"worker 5: domain 1, but an engine is one domain \(domain 0\)"),
        ([Slot(5, 8, 0, 0)], 4, "worker 5: degree 8 is not a power of two <= 4"),
    ],
    ids=[
        "misaligned-degrees",
        "degree-3",
        "short",
        "empty",
        "repeated-id",
        "misaligned-slot",
        "uncovered",
        "overlap",
        "other-domain",
        "too-large",
    ],
)
def test_groupings_the_lattice_cannot_form_are_refused(grouping, world, message):
    with pytest.raises(ValueError, match=message):
        engine_grouping(grouping, world)


def test_pool_size_must_be_a_power_of_two():
    with pytest.raises(ValueError, match=r"must be a power of two \(1, 2, 4, 8, \.\.\.\), got 6"):
        lattice_groups(6)
