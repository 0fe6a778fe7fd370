"""The composition controller's shell: one hop of window demand in, operations out.

Every ``hopSeconds`` the operator sums the router replicas' ``TakeWindow`` reports
(:mod:`vertumnus.operator.routerapi`) and hands them to the serving core's
:class:`~vertumnus.core.control.Controller` — the same planner the simulator runs — whose
state (streaks, the target of a multi-step transition, the operations handed out) is
recorded in the CPPool status with the pool state, so a restarted operator decides as
the previous one would have. Only the open window's buckets are not recorded: after a
restart a sliding window refills (disjoint windows, the default, lose nothing).

With a pinned ``spec.composition`` the planner makes no decision; :func:`next_pinned_op`
walks the layout to the pinned composition one split or merge at a time.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping

from vertumnus.core import planner
from vertumnus.core.control import Controller, Tick
from vertumnus.core.lattice import Layout, Slot, layout_for
from vertumnus.core.types import Composition, Request
from vertumnus.operator.routerapi import Window

__all__ = ["decide", "feed", "next_pinned_op", "observe"]


def feed(controller: Controller, window: Window, layout: Layout, in_flight: bool) -> Tick | None:
    """One hop: add the summed reports (:func:`observe`), let the shadow pools serve
    the hop's requests, tick (:func:`decide`). ``in_flight``: a transition is running."""
    controller.shadow_serve(observe(controller, window))
    return decide(controller, window, layout, in_flight)


def observe(controller: Controller, window: Window) -> list[Request]:
    """Add one hop's summed reports to the controller's windows; return the requests
    for its shadow pools.

    With a prefill model (the what-if check or the shadow pools on), the replicas'
    listed placements become the window's requests, arriving at the hop's start plus
    their offset on the operator's clock. A hop some replica listed only in part (its
    per-hop limit) is marked cut: the check skips the windows that hold it, and the
    shadows start over (no requests for them: they missed some)."""
    windows = controller.windows
    windows.add(window.demand_s, window.requests, window.long_requests, window.long_demand_s)
    if window.cache_blocks_per_gpu:
        controller.shadow_cache(window.cache_blocks_per_gpu)
    requests = []
    if controller.model is not None:
        whole = not window.placed_left_out
        for i, (offset, length, cached, keys, worker) in enumerate(window.placed):
            if length < 1:
                whole = False  # a malformed row: not this hop's whole load
                continue
            request = Request(i, window.started_s + max(0.0, offset), length, keys)
            windows.seen(request, min(cached, length - 1), worker)
            requests.append(request)
        if not whole:
            windows.cut()
            controller.shadow_gap()
            requests = []
    controller.capacity_reported(window.capacity, window.hop)
    for worker, blocks in window.reused_blocks.items():
        windows.reused(worker, blocks)
    return requests


def decide(controller: Controller, window: Window, layout: Layout, in_flight: bool) -> Tick | None:
    """The controller's look at the windows :func:`observe` filled."""
    running = running_of(layout, window.running_remaining_s)
    return controller.tick(running, window.reconfiguring or in_flight)


def running_of(layout: Layout, reported: Mapping[int, float]) -> dict[int, float]:
    """Remaining running prefill per worker of ``layout`` (0 for those not reported)."""
    return {s.worker: float(reported.get(s.worker, 0.0)) for s in layout.slots}


def next_pinned_op(
    layout: Layout, target: Composition, degrees: tuple[int, ...], busy: frozenset[int]
) -> planner.Op | None:
    """The next split or merge toward ``target`` (None: there, or nothing can start now).

    The target's workers are dealt to domains as :func:`~vertumnus.core.lattice.layout_for`
    packs them; each domain is matched to the target share closest to what it holds now
    (identical shares first), and the first domain not yet at its share takes the first
    step of the shortest split/merge path there (breadth-first over that one domain's
    buddy-aligned groupings: a few dozen at 8 GPUs). Domains with a worker in ``busy``
    (already in a transition) wait.
    """
    if Counter(s.degree for s in layout.slots) == Counter(target.degrees):
        return None
    size = layout.domain_size
    domains = sorted({s.domain for s in layout.slots})
    shares = [
        tuple(sorted(s.degree for s in part.slots if s.domain == d))
        for part in (layout_for(target, size),)
        for d in range(len(domains))
    ]
    current = {d: tuple(sorted(s.degree for s in layout.domain(d))) for d in domains}
    assigned: dict[int, tuple[int, ...]] = {}
    left = list(shares)
    for d in domains:  # identical shares first: those domains need nothing
        if current[d] in left:
            assigned[d] = current[d]
            left.remove(current[d])
    for d in domains:
        if d not in assigned:
            assigned[d] = left.pop(0)
    for d in domains:
        slots = layout.domain(d)
        if current[d] == assigned[d] or any(s.worker in busy for s in slots):
            continue
        step = _first_step(slots, assigned[d], set(degrees), size)
        if step is not None:
            return step
    return None


def _first_step(
    slots: tuple[Slot, ...], want: tuple[int, ...], allowed: set[int], size: int
) -> planner.Op | None:
    """The first op of a shortest path from ``slots`` (one domain) to the degrees ``want``."""
    start = tuple(sorted((s.offset, s.degree) for s in slots))
    by_pos = {(s.offset, s.degree): s.worker for s in slots}
    seen = {start}
    queue: deque[tuple[tuple[tuple[int, int], ...], tuple[int, int, int] | None]] = deque(
        [(start, None)]
    )
    while queue:
        state, first = queue.popleft()
        if tuple(sorted(d for _, d in state)) == want:
            if first is None:
                return None
            kind, off, deg = first
            if kind == 0:
                return planner.Split(by_pos[(off, deg)], "pinned composition")
            return planner.Merge(
                (by_pos[(off, deg)], by_pos[(off + deg, deg)]), "pinned composition"
            )
        cells = dict(state)
        for off, deg in state:
            if deg % 2 == 0 and deg // 2 in allowed:
                nxt = tuple(
                    sorted(
                        [x for x in state if x != (off, deg)]
                        + [(off, deg // 2), (off + deg // 2, deg // 2)]
                    )
                )
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, first or (0, off, deg)))
            if (
                2 * deg in allowed
                and 2 * deg <= size
                and off % (2 * deg) == 0
                and cells.get(off + deg) == deg
            ):
                nxt = tuple(
                    sorted(
                        [x for x in state if x not in ((off, deg), (off + deg, deg))]
                        + [(off, 2 * deg)]
                    )
                )
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, first or (1, off, deg)))
    return None
