"""The groups one engine's ranks can form, and the groupings an engine accepts.

An engine is one NVLink domain of N ranks (N a power of two); in the pool's
vocabulary (:class:`vertumnus.core.lattice.Slot`) it is domain 0, and a
worker's ``offset`` is its first rank. A worker of degree C uses C
consecutive ranks starting at a multiple of C, so the multi-rank groups any
grouping can need are known in advance — the lattice: for 8 ranks, one CP8,
two CP4, four CP2 (CP1 needs no process group). Rank processes create a
process group for every one of them at start (:func:`lattice_groups`),
because ``torch.distributed.new_group`` must be called by every rank in the
same order: creating them later would need every rank of the pool to stop
at once.

Worker ids are pool-level ids chosen by the controller. A plain list of
degrees (the CLI, tests) lays the workers out left to right with the
default id of each = its first rank (:func:`default_grouping`).
"""

from __future__ import annotations

from collections.abc import Sequence

from vertumnus.core.lattice import Slot, check_grouping

__all__ = ["ENGINE_DOMAIN", "check_world", "default_grouping", "engine_grouping", "lattice_groups"]

ENGINE_DOMAIN = 0  # an engine is one domain; the slots it takes and reports use this index


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_world(world: int) -> None:
    """Raise ValueError unless ``world`` ranks can form a lattice (a power of two)."""
    if not _is_power_of_two(world):
        raise ValueError(
            f"the pool size (rank count) must be a power of two (1, 2, 4, 8, ...), got {world}"
        )


def lattice_groups(world: int) -> list[range]:
    """The ranks of every multi-rank group of the lattice, in the fixed creation order."""
    check_world(world)
    out: list[range] = []
    size = 2
    while size <= world:
        out.extend(range(offset, offset + size) for offset in range(0, world, size))
        size *= 2
    return out


def default_grouping(degrees: Sequence[int], world: int) -> list[Slot]:
    """Workers of ``degrees`` laid out left to right over the ranks; id = first rank."""
    check_world(world)
    if not degrees:
        raise ValueError("a grouping needs at least one worker degree")
    slots, offset = [], 0
    for d in degrees:
        if not _is_power_of_two(d):
            raise ValueError(f"worker degree {d} is not a power of two")
        if offset % d:
            raise ValueError(
                f"a CP{d} worker cannot start at rank {offset}: lattice groups of degree {d} "
                f"start at multiples of {d} (reorder the degrees, e.g. larger first)"
            )
        slots.append(Slot(offset, d, ENGINE_DOMAIN, offset))
        offset += d
    if offset != world:
        raise ValueError(f"degrees {list(degrees)} cover {offset} ranks, the pool has {world}")
    return slots


def engine_grouping(grouping: Sequence[Slot] | Sequence[int], world: int) -> list[Slot]:
    """The workers of ``grouping`` (Slots, or degrees left to right), checked and sorted by offset.

    Slots must be in domain 0, have ids that fit the protocol (uint32), pass
    :func:`vertumnus.core.lattice.check_grouping` and use every rank.
    Raises ValueError naming the fault.
    """
    check_world(world)
    items = list(grouping)
    if not items:
        raise ValueError("a grouping needs at least one worker")
    degrees = [x for x in items if isinstance(x, int) and not isinstance(x, bool)]
    if len(degrees) == len(items):
        return default_grouping(degrees, world)
    slots: list[Slot] = []
    for x in items:
        if not isinstance(x, Slot):
            raise ValueError(f"a grouping is a list of Slots or of degrees, got {x!r}")
        slots.append(x)
    for s in slots:
        if s.domain != ENGINE_DOMAIN:
            raise ValueError(
                f"worker {s.worker}: domain {s.domain}, but an engine is one domain (domain {ENGINE_DOMAIN})"
            )
        if not 0 <= s.worker < 2**32:
            raise ValueError(f"worker id {s.worker} is outside 0..2^32-1")
    check_grouping(slots, world)
    used = {r for s in slots for r in s.ranks}
    idle = [r for r in range(world) if r not in used]
    if idle:
        raise ValueError(
            f"ranks {idle} are in no worker: a grouping uses every rank of the {world}-rank pool"
        )
    return sorted(slots, key=lambda s: s.offset)
