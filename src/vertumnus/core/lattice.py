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
    "check_grouping",
    "merge_slots",
    "split_slot",
    "domain_partitions",
    "enumerate_lattice",
    "large_first_key",
    "layout_for",
    "neighbours",
]


@dataclass(frozen=True, slots=True)
class Slot:
    """One worker and its place: ``degree`` GPUs at ``offset`` in NVLink domain ``domain``.

    The one vocabulary of the pool's shape, shared by the planner, the
    simulator, the router, the operator and the CP engine: ``worker`` is the
    worker's id in the pool (unique over the pool's life: a split or merge
    creates workers with new ids), ``domain`` the NVLink domain (node, pod)
    and ``offset`` its first GPU there, so its ranks are
    ``offset .. offset + degree − 1`` of that domain.
    """

    worker: int
    degree: int
    domain: int
    offset: int

    @property
    def ranks(self) -> range:
        """The worker's ranks (GPU indices) inside its domain."""
        return range(self.offset, self.offset + self.degree)


def split_slot(slot: Slot, new_ids: Sequence[int]) -> tuple[Slot, Slot]:
    """The two halves a split of ``slot`` creates (the first id takes the lower offset)."""
    if slot.degree % 2 or slot.degree < 2:
        raise ValueError(f"worker {slot.worker}: cannot split degree {slot.degree}")
    if len(new_ids) != 2:
        raise ValueError(f"a split creates two workers, got ids {list(new_ids)}")
    half = slot.degree // 2
    return (
        Slot(new_ids[0], half, slot.domain, slot.offset),
        Slot(new_ids[1], half, slot.domain, slot.offset + half),
    )


def merge_slots(a: Slot, b: Slot, new_id: int) -> Slot:
    """The worker a merge of the buddies ``a`` and ``b`` creates."""
    lo, hi = (a, b) if a.offset < b.offset else (b, a)
    if (
        lo.degree != hi.degree
        or lo.domain != hi.domain
        or hi.offset != lo.offset + lo.degree
        or lo.offset % (2 * lo.degree)
    ):
        raise ValueError(f"workers {a.worker} and {b.worker} are not buddies: {a} and {b}")
    return Slot(new_id, 2 * lo.degree, lo.domain, lo.offset)


def check_grouping(slots: Sequence[Slot], domain_size: int) -> None:
    """Raise ValueError naming the fault unless ``slots`` tile their domains with
    buddy-aligned workers of power-of-two degree and distinct ids."""
    ids = [s.worker for s in slots]
    if len(set(ids)) != len(ids):
        raise ValueError(f"worker ids repeat in the grouping: {sorted(ids)}")
    used: dict[tuple[int, int], int] = {}
    for s in slots:
        if not _is_pow2(s.degree) or s.degree > domain_size:
            raise ValueError(
                f"worker {s.worker}: degree {s.degree} is not a power of two <= {domain_size}"
            )
        if s.domain < 0 or s.offset < 0 or s.offset + s.degree > domain_size:
            raise ValueError(
                f"worker {s.worker}: ranks {s.offset}..{s.offset + s.degree - 1} "
                f"are outside a {domain_size}-GPU domain"
            )
        if s.offset % s.degree:
            raise ValueError(
                f"worker {s.worker}: a CP{s.degree} worker cannot start at rank {s.offset} "
                f"(lattice groups of degree {s.degree} start at multiples of {s.degree})"
            )
        for r in s.ranks:
            other = used.get((s.domain, r))
            if other is not None:
                raise ValueError(
                    f"workers {other} and {s.worker} both use rank {r} of domain {s.domain}"
                )
            used[(s.domain, r)] = s.worker


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

    def split(self, worker: int, new_ids: Sequence[int]) -> Layout:
        """This layout after splitting ``worker`` into two workers ``new_ids``."""
        old = self.slot(worker)
        rest = [s for s in self.slots if s.worker != worker]
        return self._with(rest + list(split_slot(old, new_ids)))

    def merge(self, a: int, b: int, new_id: int) -> Layout:
        """This layout after merging the buddies ``a`` and ``b`` into worker ``new_id``."""
        sa, sb = self.slot(a), self.slot(b)
        rest = [s for s in self.slots if s.worker not in (a, b)]
        return self._with([*rest, merge_slots(sa, sb, new_id)])

    def domain(self, domain: int) -> tuple[Slot, ...]:
        """The workers of one domain, by offset."""
        return tuple(s for s in self.slots if s.domain == domain)

    def _with(self, slots: list[Slot]) -> Layout:
        slots.sort(key=lambda s: (s.domain, s.offset))
        return Layout(tuple(slots), self.domain_size)


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
