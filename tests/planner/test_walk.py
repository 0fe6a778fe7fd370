"""The incremental walk (planner.walk) takes exactly the decisions of the full re-enumeration.

``_walk_reference`` below is the walk as it was before it became incremental
(2026-11-30): at every step it re-enumerates every candidate operation
(all slots, buddy pairs, merge admission), ranks them and re-sorts the slots.
The incremental walk must return the same operations, in the same order, and
the same composition, on random layouts, loads, observations, pending
operations, targets and limits; and ``step`` / ``advance`` built on it must
behave as before (they only call the walk).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from vertumnus.core import planner
from vertumnus.core.planner import (
    CapacityProfile,
    Composition,
    Layout,
    Merge,
    Op,
    PlannerSettings,
    Slot,
    Split,
    WindowObservation,
    WorkerObservation,
    _apply,
    _members,
    _merge_admitted,
    _signal,
    buddy_pairs,
)

CAP = CapacityProfile({1: 0.29, 2: 0.38, 4: 0.46, 8: 0.63})


# ---------------------------------------------------------------------------
# The reference: the walk before it became incremental (copied verbatim, with
# its ranking and capacity functions). One deliberate difference: the planner
# now sums capacities path-independently (``_capacities_of``, math.fsum over
# the degree counts) where the old walk added deltas step by step, so the two
# may differ where a threshold falls within a rounding error of the boundary
# (test_target_is_path_independent_at_a_rounding_boundary); random demands
# never land there.
# ---------------------------------------------------------------------------


def _capacities_reference(
    degrees, capacity: CapacityProfile, settings: PlannerSettings
) -> tuple[float, float]:
    # Exactly rounded sums of the multiset (as the planner's): a long share
    # exactly at the merged large-degree share (1.0 on an all-largest pool)
    # must not be decided by the last bit of a running sum.
    degs = list(degrees)
    large = max(settings.degrees)
    return (
        math.fsum(capacity.kappa(d) for d in degs),
        math.fsum(capacity.kappa(d) for d in degs if d >= large),
    )


def _rank_reference(
    ops: Sequence[Op], workers: Sequence[WorkerObservation], settings: PlannerSettings
) -> Op | None:
    """Smallest predicted drain, then least reconciliation traffic, then lowest id."""
    if not ops:
        return None
    by_worker = {w.worker: w for w in workers}

    def drain(op: Op) -> float:
        return max(
            (by_worker[w].running_remaining_s if w in by_worker else 0.0) for w in _members(op)
        )

    def traffic(op: Op) -> float:
        return sum(by_worker[w].reuse_weight if w in by_worker else 0.0 for w in _members(op))

    shortest = min(drain(op) for op in ops)
    near = [op for op in ops if drain(op) <= shortest + settings.drain_tie_s]
    return min(near, key=lambda op: (traffic(op), drain(op), min(_members(op))))


def _walk_reference(
    layout: Layout,
    pending: Sequence[Op],
    loads: Sequence[WindowObservation],
    direction: str,
    capacity: CapacityProfile,
    settings: PlannerSettings,
    workers: Sequence[WorkerObservation],
    *,
    target: Composition | None = None,
    limit: int | None = None,
) -> tuple[list[Op], Composition]:
    slots = list(layout.slots)
    next_id = min([0, *(s.worker for s in slots)]) - 1

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = [next_id - i for i in range(n)]
        next_id -= n
        return ids

    for op in pending:
        slots = _apply(slots, op, fresh(2 if isinstance(op, Split) else 1))
    busy = {w for op in pending for w in _members(op)}
    real = {s.worker for s in layout.slots} - busy
    k_cap, k_large = _capacities_reference((s.degree for s in slots), capacity, settings)
    allowed = set(settings.degrees)
    ops: list[Op] = []
    for _ in range(layout.composition.gpus):
        if limit is not None and len(ops) >= limit:
            break
        comp = Composition(tuple(s.degree for s in slots))
        if target is not None and comp == target:
            break
        if any(_signal(k_cap, k_large, w, settings)[0] != direction for w in loads):
            break
        lay = Layout(tuple(slots), layout.domain_size)
        cands: list[Op]
        if direction == "split":
            cands = [
                Split(s.worker) for s in slots if s.degree % 2 == 0 and s.degree // 2 in allowed
            ]
        else:
            degree_of = {s.worker: s.degree for s in slots}
            ok = {
                d: _merge_admitted(k_cap, k_large, d, loads, capacity, settings)
                for d in set(degree_of.values())
                if 2 * d in allowed
            }
            cands = [
                Merge((a.worker, b.worker))
                for a, b in buddy_pairs(lay, allowed)
                if ok.get(a.degree, False)
            ]
        now = [op for op in cands if all(w in real for w in _members(op))]
        best = _rank_reference(now or cands, workers, settings)
        if best is None:
            break
        op = best
        ops.append(op)
        slots = _apply(slots, op, fresh(2 if isinstance(op, Split) else 1))
        k_cap, k_large = _capacities_reference((s.degree for s in slots), capacity, settings)
    return ops, Composition(tuple(s.degree for s in slots))


# ---------------------------------------------------------------------------
# Random cases
# ---------------------------------------------------------------------------

DEGREE_SETS = ((4, 8), (2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (2, 8), (1, 4, 8))


def random_layout(rng: random.Random, domains: int, degrees: tuple[int, ...]) -> Layout:
    """A buddy-aligned layout: each domain cut recursively at random into allowed degrees;
    worker ids shuffled (so id order says nothing about position)."""
    allowed = set(degrees)
    places: list[tuple[int, int, int]] = []

    def cut(dom: int, off: int, size: int) -> None:
        can_split = size > 1 and size // 2 >= min(allowed)
        if size in allowed and (not can_split or rng.random() < 0.45):
            places.append((size, dom, off))
        else:
            cut(dom, off, size // 2)
            cut(dom, off + size // 2, size // 2)

    for dom in range(domains):
        cut(dom, 0, 8)
    ids = list(range(len(places)))
    rng.shuffle(ids)
    slots = sorted(
        (Slot(i, d, dom, off) for i, (d, dom, off) in zip(ids, places, strict=True)),
        key=lambda s: (s.domain, s.offset),
    )
    return Layout(tuple(slots))


def random_workers(rng: random.Random, layout: Layout) -> tuple[WorkerObservation, ...]:
    style = rng.choice(("ties", "continuous", "idle", "sparse"))
    out = []
    for s in layout.slots:
        if style == "sparse" and rng.random() < 0.5:
            continue  # no observation: counts as idle and cold
        if style == "idle":
            out.append(WorkerObservation(s.worker))
        elif style == "ties":
            out.append(WorkerObservation(s.worker, rng.choice((0.0, 0.1, 0.3)), rng.randrange(3)))
        else:
            out.append(WorkerObservation(s.worker, rng.uniform(0, 1.5), rng.uniform(0, 50)))
    rng.shuffle(out)
    return tuple(out)


def random_loads(
    rng: random.Random, layout: Layout, settings: PlannerSettings
) -> tuple[WindowObservation, ...]:
    """One to three windows in one regime (u and long share drawn near each other)."""
    k = CAP.capacity_per_s(s.degree for s in layout.slots) * settings.window_s
    u0 = rng.choice((rng.uniform(0.05, 0.5), rng.uniform(0.4, 1.0), rng.uniform(0.85, 2.5)))
    share0 = rng.choice((0.0, rng.random(), rng.uniform(0.8, 1.0)))
    out = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        u = u0 * rng.uniform(0.85, 1.15)
        share = min(1.0, share0 * rng.uniform(0.8, 1.2))
        n = rng.choice((5, 100, 100))
        out.append(WindowObservation(u * k, n, n // 10, share * u * k))
    return tuple(out)


def random_pending(rng: random.Random, layout: Layout, settings: PlannerSettings) -> list[Op]:
    """Up to three disjoint operations the topology allows (in flight)."""
    cands: list[Op] = [*planner.eligible_splits(layout, settings)]
    cands += planner.eligible_merges(layout, settings)
    rng.shuffle(cands)
    used: set[int] = set()
    out: list[Op] = []
    for op in cands[: rng.randrange(4)]:
        if used.isdisjoint(_members(op)):
            out.append(op)
            used.update(_members(op))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_incremental_walk_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    checked = 0
    for _ in range(250):
        degrees = rng.choice(DEGREE_SETS)
        settings = PlannerSettings(
            degrees=degrees,
            window_s=rng.choice((10.0, 20.0)),
            upper=rng.choice((0.9, 1.0)),
            lower=rng.choice((0.3, 0.45)),
            merge_admit=rng.choice((0.6, 0.8, 0.9)),
            mix_margin=rng.choice((0.1, 0.2)),
            drain_tie_s=rng.choice((0.0, 0.25, 1.0)),
            min_requests=20,
        )
        layout = random_layout(rng, rng.choice((1, 2, 5, 12)), degrees)
        workers = random_workers(rng, layout)
        loads = random_loads(rng, layout, settings)
        pending = random_pending(rng, layout, settings) if rng.random() < 0.4 else []
        k_cap, k_large = _capacities_reference((s.degree for s in layout.slots), CAP, settings)
        asked = _signal(k_cap, k_large, loads[0], settings)[0]
        direction = asked if asked and rng.random() < 0.85 else rng.choice(("split", "merge"))
        limit = rng.choice((None, 1, 2, 16))
        target = None
        if rng.random() < 0.3:
            _, target = _walk_reference(layout, pending, loads, direction, CAP, settings, workers)
            if rng.random() < 0.5:
                target = Composition(tuple(s.degree for s in layout.slots))
        args = (layout, pending, loads, direction, CAP, settings, workers)
        want = _walk_reference(*args, target=target, limit=limit)
        got = planner.walk(*args, target=target, limit=limit)
        assert got == want, (seed, layout, pending, loads, direction, limit, target)
        checked += len(want[0])
    assert checked > 250  # the cases do walk (not only stop at once)


def test_large_pool_walks_match_the_reference() -> None:
    """The planner-speed benchmark's 1,024-GPU pool, every case it times, full walks."""
    settings = PlannerSettings(degrees=(1, 2, 4, 8), persist_windows=1)
    layout = planner.layout_for(Composition.parse("512xCP1+128xCP2+64xCP4"))
    workers = tuple(
        WorkerObservation(s.worker, (s.worker % 7) * 0.1, s.worker % 5) for s in layout.slots
    )
    k = CAP.capacity_per_s(s.degree for s in layout.slots) * settings.window_s
    for direction, load in (
        ("split", WindowObservation(1.5 * k, 1000, 10, 0.1 * k)),
        ("merge", WindowObservation(0.2 * k, 1000, 10, 0.1 * k)),
        ("merge", WindowObservation(0.6 * k, 1000, 300, 0.54 * k)),
    ):
        for limit in (16, None):
            args = (layout, (), (load,), direction, CAP, settings, workers)
            want = _walk_reference(*args, limit=limit)
            assert planner.walk(*args, limit=limit) == want
            assert len(want[0]) >= 16


def test_step_and_advance_take_the_reference_decisions() -> None:
    """A whole multi-step transition (step, then advance after each commit) on random pools."""
    rng = random.Random(7)
    for _ in range(40):
        degrees = rng.choice(DEGREE_SETS)
        settings = PlannerSettings(degrees=degrees, persist_windows=1, max_walk=4)
        layout = random_layout(rng, rng.choice((2, 5)), degrees)
        load = random_loads(rng, layout, settings)[0]
        state = planner.initial_state(layout)
        state, ops = planner.step(state, load, CAP, settings)
        next_id = 1000
        while state.pending:
            want, _ = _walk_reference(
                state.layout,
                state.pending,
                state.plan,
                state.momentum or "",
                CAP,
                settings,
                (),
                limit=settings.max_walk,
            )
            got, _ = planner.walk(
                state.layout,
                state.pending,
                state.plan,
                state.momentum or "",
                CAP,
                settings,
                (),
                limit=settings.max_walk,
            )
            assert got == want
            op = state.pending[rng.randrange(len(state.pending))]
            new = [next_id, next_id + 1] if isinstance(op, Split) else [next_id]
            next_id += len(new)
            state = planner.commit(state, new, op)
            state, _ = planner.advance(state, (), CAP, settings)


def test_target_is_path_independent_at_a_rounding_boundary() -> None:
    """The case hypothesis found in test_multistep.py (12xCP2, κ_2 = 0.3, κ_4 = 0.5).

    The sixth CP2 merge is admitted iff 27 s <= 0.9·10·(K − 0.1) with K = 3.1
    exactly: the old walk's K, accumulated by deltas from 3.6, was 1 ulp low
    and refused it (target 2xCP2+5xCP4), while advance, summing the layout
    afresh, admitted it — the transition ended at 6xCP4, off its target. With
    K a function of the multiset alone, the target is where it ends.
    """
    cap = CapacityProfile({2: 0.3, 4: 0.5, 8: 0.6})
    settings = PlannerSettings(
        window_s=10.0,
        upper=1.0,
        lower=0.5,
        merge_admit=0.9,
        mix_margin=0.1,
        min_requests=10,
        degrees=(2, 4, 8),
        max_concurrent_ops=1,
        transition_admit=0.5,
    )
    layout = planner.layout_for(Composition.parse("12xCP2"))
    k = cap.capacity_per_s(s.degree for s in layout.slots) * settings.window_s
    state = planner.initial_state(layout)
    for u in (0.5, 0.75):
        state, ops = planner.step(state, WindowObservation(u * k, 100, 50, u * k), cap, settings)
    target = state.target
    assert target is not None
    next_id = 100
    while state.pending:
        op = state.pending[0]
        new = [next_id, next_id + 1] if isinstance(op, Split) else [next_id]
        next_id += len(new)
        state = planner.commit(state, new, op)
        state, _ = planner.advance(state, (), cap, settings)
    assert state.layout.composition == target
