"""The lattice of CP groups a pool of ranks can be arranged into.

A pool of N ranks (N a power of two: the GPUs of one NVLink domain) can form
workers of any power-of-two degree C whose ranks are C consecutive ranks
starting at a multiple of C. Splitting a CP2C worker gives its two aligned
halves; merging two aligned sibling workers gives their parent. These aligned
groups are the lattice: for 8 ranks, one CP8, two CP4, four CP2 (and eight
CP1, which need no process group). Rank processes create a process group for
every lattice group at start, because ``torch.distributed.new_group`` must be
called by every rank in the same order: creating them later would need every
rank of the pool to stop at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class WorkerSlot:
    """One worker of a grouping: ``degree`` ranks starting at global rank ``first``.

    ``first`` doubles as the worker's id: it is the rank whose endpoint serves it.
    """

    first: int
    degree: int

    @property
    def ranks(self) -> range:
        return range(self.first, self.first + self.degree)


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def lattice_groups(world: int) -> list[WorkerSlot]:
    """Every multi-rank group of the lattice, in the fixed creation order."""
    if not _is_power_of_two(world):
        raise ValueError(f"pool size must be a power of two, got {world}")
    out = []
    size = 2
    while size <= world:
        out.extend(WorkerSlot(first, size) for first in range(0, world, size))
        size *= 2
    return out


def grouping(degrees: Sequence[int], world: int) -> list[WorkerSlot]:
    """Workers for ``degrees`` laid out left to right over the ranks, checked against the lattice."""
    if not degrees:
        raise ValueError("a grouping needs at least one worker degree")
    slots, first = [], 0
    for d in degrees:
        if not _is_power_of_two(d):
            raise ValueError(f"worker degree {d} is not a power of two")
        if first % d:
            raise ValueError(
                f"a CP{d} worker cannot start at rank {first}: lattice groups of degree {d} "
                f"start at multiples of {d} (reorder the degrees, e.g. larger first)"
            )
        slots.append(WorkerSlot(first, d))
        first += d
    if first != world:
        raise ValueError(f"degrees {list(degrees)} cover {first} ranks, the pool has {world}")
    return slots
