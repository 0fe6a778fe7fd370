"""The lattice of aligned groups, and grouping validation."""

from __future__ import annotations

import pytest
from vertumnus.worker.lattice import WorkerSlot, grouping, lattice_groups


def test_lattice_of_8_ranks_in_creation_order():
    assert lattice_groups(8) == [
        WorkerSlot(0, 2), WorkerSlot(2, 2), WorkerSlot(4, 2), WorkerSlot(6, 2),
        WorkerSlot(0, 4), WorkerSlot(4, 4),
        WorkerSlot(0, 8),
    ]
    assert lattice_groups(1) == []


def test_grouping_lays_workers_out_left_to_right():
    assert grouping([4, 2, 1, 1], 8) == [WorkerSlot(0, 4), WorkerSlot(4, 2), WorkerSlot(6, 1), WorkerSlot(7, 1)]
    assert list(WorkerSlot(4, 2).ranks) == [4, 5]


@pytest.mark.parametrize(
    ("degrees", "world", "message"),
    [
        ([2, 4, 2], 8, "a CP4 worker cannot start at rank 2"),
        ([3, 1], 4, "worker degree 3 is not a power of two"),
        ([2], 4, "cover 2 ranks, the pool has 4"),
        ([], 4, "at least one worker"),
    ],
)
def test_groupings_the_lattice_cannot_form_are_refused(degrees, world, message):
    with pytest.raises(ValueError, match=message):
        grouping(degrees, world)


def test_pool_size_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two, got 6"):
        lattice_groups(6)
