"""Topology of a prefill pool: where workers sit, and the compositions split/merge can reach.

A pool's GPUs form NVLink domains (nodes) of ``domain_size`` GPUs; a worker
never spans domains. Workers are **buddy-aligned**: a degree-C worker starts
at an offset that is a multiple of C, so a degree-2C worker splits into two
degree-C workers at offsets o and o+C, and two degree-C *buddies* (same
domain, offsets o and o+C with o a multiple of 2C) merge into one degree-2C
worker — the only topology-compatible operations, and both keep the GPU
count. The **lattice** of a GPU budget is every composition reachable this
way. Pure functions; the composition planner (:mod:`vertumnus.core.planner`)
decides which of these moves to make.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from vertumnus.core.types import Composition

__all__ = [
    "Layout",
    "Slot",
    "buddy_pairs",
    "domain_partitions",
    "enumerate_lattice",
    "large_first_key",
    "layout_for",
    "neighbours",
]




@dataclass(frozen=True, slots=True)
class Slot:
    """One worker's place: ``degree`` GPUs at ``offset`` in NVLink domain ``domain``."""

    worker: int
    degree: int
    domain: int
    offset: int


@dataclass(frozen=True)
class Layout:
    """Workers and where they sit; ``slots`` sorted by (domain, offset)."""

    slots: tuple[Slot, ...]
    domain_size: int = 8

    @property
    def composition(self) -> Composition:
        return Composition(tuple(s.degree for s in self.slots))

    def slot(self, worker: int) -> Slot:
        for s in self.slots:
            if s.worker == worker:
                return s
        raise KeyError(f"worker {worker} is not in the layout")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def layout_for(composition: Composition, domain_size: int = 8, first_id: int = 0) -> Layout:
    """Place ``composition`` buddy-aligned on ``ceil(gpus / domain_size)`` domains.

    Largest degrees first, each in the first aligned free range (first fit),
    so equal-degree workers end up as buddies wherever possible. Worker ids
    are ``first_id, first_id + 1, ...`` in ascending-degree order, the order
    :class:`~vertumnus.sim.engine.Simulation` creates them in. Raises
    ValueError if a degree is not a power of two no larger than a domain or
    the workers do not pack.
    """
    for d in set(composition.degrees):
        if not _is_pow2(d) or d > domain_size:
            raise ValueError(
                f"degree {d} is not a power of two <= the NVLink domain size {domain_size}"
            )
    n_domains = math.ceil(composition.gpus / domain_size)
    used = [[False] * domain_size for _ in range(n_domains)]
    placed: list[tuple[int, int, int]] = []  # (degree, domain, offset)
    for d in sorted(composition.degrees, reverse=True):
        for dom in range(n_domains):
            off = next((o for o in range(0, domain_size, d) if not any(used[dom][o : o + d])), None)
            if off is not None:
                for g in range(off, off + d):
                    used[dom][g] = True
                placed.append((d, dom, off))
                break
        else:
            raise ValueError(f"composition {composition} does not pack into {n_domains} domains")
    # Ids in ascending degree order (stable by position) to match the simulator.
    placed.sort(key=lambda p: (p[0], p[1], p[2]))
    slots = [Slot(first_id + i, d, dom, off) for i, (d, dom, off) in enumerate(placed)]
    slots.sort(key=lambda s: (s.domain, s.offset))
    return Layout(tuple(slots), domain_size)


def domain_partitions(domain_size: int, degrees: Sequence[int]) -> list[tuple[int, ...]]:
    """Every way to cut one domain into buddy-aligned workers of the given degrees.

    Recursively: a block of size s is either one worker (if s is an allowed
    degree) or two halves, each partitioned the same way. Returned as sorted
    degree tuples, without duplicates.
    """
    allowed = set(degrees)
    memo: dict[int, set[tuple[int, ...]]] = {}

    def parts(size: int) -> set[tuple[int, ...]]:
        if size in memo:
            return memo[size]
        out: set[tuple[int, ...]] = set()
        if size in allowed:
            out.add((size,))
        if size > 1 and size % 2 == 0:
            half = parts(size // 2)
            for a in half:
                for b in half:
                    out.add(tuple(sorted(a + b)))
        memo[size] = out
        return out

    return sorted(parts(domain_size))


def enumerate_lattice(gpus: int, degrees: Sequence[int], domain_size: int = 8) -> list[Composition]:
    """All compositions of ``gpus`` GPUs the split/merge operations can reach.

    ``gpus`` must be a whole number of domains. Each domain is cut
    independently (:func:`domain_partitions`); the pool's composition is the
    multiset union. Sorted by descending count of the largest degree, then the
    next (so more large-degree workers come first).
    """
    if gpus < 1 or gpus % domain_size:
        raise ValueError(f"{gpus} GPUs is not a whole number of {domain_size}-GPU domains")
    per_domain = domain_partitions(domain_size, degrees)
    if not per_domain:
        raise ValueError(f"degrees {tuple(degrees)} cannot tile a {domain_size}-GPU domain")
    combos: set[tuple[int, ...]] = {()}
    for _ in range(gpus // domain_size):
        combos = {tuple(sorted(c + p)) for c in combos for p in per_domain}
    return sorted((Composition(c) for c in combos), key=large_first_key)


def large_first_key(c: Composition) -> tuple[int, ...]:
    """Sort key: more workers of the largest degree first, then of the next."""
    # Descending degrees, compared lexicographically with bigger first: negate.
    return tuple(-d for d in sorted(c.degrees, reverse=True))


def neighbours(
    composition: Composition, degrees: Sequence[int], domain_size: int = 8
) -> list[Composition]:
    """Compositions one split or merge away, at the multiset level.

    A split of a degree-2C worker is always topology-compatible; a merge of
    two degree-C workers is possible when the layout makes them buddies, which
    :func:`layout_for` guarantees whenever two same-degree workers share a
    domain. Used for the lattice's edges; the controller works on the layout.
    """
    allowed = set(degrees)
    out: set[Composition] = set()
    for d in sorted(set(composition.degrees)):
        if d % 2 == 0 and d // 2 in allowed:
            rest = list(composition.degrees)
            rest.remove(d)
            out.add(Composition(tuple(rest + [d // 2, d // 2])))
    layout = layout_for(composition, domain_size)
    for a, _ in buddy_pairs(layout, allowed):
        rest = list(composition.degrees)
        rest.remove(a.degree)
        rest.remove(a.degree)
        out.add(Composition(tuple(rest + [2 * a.degree])))
    return sorted(out, key=large_first_key)


def buddy_pairs(layout: Layout, allowed: set[int]) -> list[tuple[Slot, Slot]]:
    """Pairs of buddies in ``layout`` whose merged degree is in ``allowed``."""
    by_pos = {(s.domain, s.offset): s for s in layout.slots}
    pairs = []
    for s in layout.slots:
        if (
            2 * s.degree in allowed
            and 2 * s.degree <= layout.domain_size
            and s.offset % (2 * s.degree) == 0
        ):
            other = by_pos.get((s.domain, s.offset + s.degree))
            if other is not None and other.degree == s.degree:
                pairs.append((s, other))
    return pairs
