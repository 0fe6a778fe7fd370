"""Where the pool starts: the initial composition from a past workload (design.md section 4).

The shell hands the controller a history (the first seconds of a trace, or
the traffic the pool saw before a restart); :func:`history_requests` turns it
into the planner's view, with the reuse an ideal global cache would give it,
and :func:`initial_composition` picks the starting composition: with the
what-if check on, the lattice point whose replay of the history
(:mod:`vertumnus.core.whatif`) gives the lowest mean TTFT
(:func:`composition_estimates`; a large lattice is searched coarse to fine);
otherwise the rules' pick (:func:`vertumnus.core.planner.initial_composition`).
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from vertumnus.core import planner, whatif
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition, Request, cached_tokens

__all__ = ["ESTIMATED", "composition_estimates", "history_requests", "initial_composition"]


def initial_composition(
    requests: Sequence[Request],
    block_size: int,
    history_s: float | None,
    lattice: Sequence[Composition],
    capacity: planner.CapacityProfile,
    model: PrefillModel,
    settings: planner.PlannerSettings,
    params: PlacementParams | None = None,
) -> Composition:
    """Where the pool starts, from the first ``history_s`` seconds of ``requests``
    (all if None).

    With ``settings.whatif``: the candidate of :func:`composition_estimates` with
    the lowest estimated mean TTFT on the history (the first on ties). Otherwise
    the rules' pick (:func:`vertumnus.core.planner.initial_composition`).
    """
    if not settings.whatif:
        history = history_requests(requests, block_size, history_s)
        return planner.initial_composition(
            history, lattice, capacity, model, settings, params or PlacementParams()
        )
    ruled, estimates = composition_estimates(
        requests, block_size, history_s, lattice, capacity, model, settings, params
    )
    if not estimates:
        return ruled
    return min(enumerate(estimates), key=lambda ie: (ie[1].mean_s, ie[0]))[1].composition


def composition_estimates(
    requests: Sequence[Request],
    block_size: int,
    history_s: float | None,
    lattice: Sequence[Composition],
    capacity: planner.CapacityProfile,
    model: PrefillModel,
    settings: planner.PlannerSettings,
    params: PlacementParams | None = None,
) -> tuple[Composition, list[whatif.Estimate]]:
    """The rules' pick for the first ``history_s`` seconds of ``requests`` (all if
    None), and the what-if estimate of each candidate on them (empty without a
    history), in the candidates' order.

    The candidates are the lattice, in its order; of a lattice of more than
    :data:`ESTIMATED` points, those a coarse-to-fine search estimates
    (:func:`_coarse_to_fine`). Reuse is as :func:`history_requests` estimates it.
    """
    params = params or PlacementParams()
    history = history_requests(requests, block_size, history_s)
    ruled = planner.initial_composition(history, lattice, capacity, model, settings, params)
    if not history:
        return ruled, []
    lattice = list(lattice)
    degrees = sorted({d for c in lattice for d in c.degrees})
    rows = [
        (h.arrival_s, h.length, h.cached_tokens, r.block_keys)
        for h, r in zip(history, requests, strict=False)
    ]
    table = whatif.RequestTable(rows, block_size, model, degrees)
    if len(lattice) <= ESTIMATED:
        return ruled, whatif.best_of(table, lattice, params)[1]
    return ruled, _coarse_to_fine(table, lattice, ruled, settings, params)


ESTIMATED = 64
"""The most lattice points the start estimates one by one (a 1,024-GPU CP4/CP8
lattice has 129: 5–17 ms each on a history of 225 s at light load here)."""


def _coarse_to_fine(
    table: whatif.RequestTable,
    lattice: list[Composition],
    ruled: Composition,
    settings: planner.PlannerSettings,
    params: PlacementParams,
) -> list[whatif.Estimate]:
    """The estimates of a large lattice's likely best: every ``step``-th point (in the
    lattice's order, its last, the rules' pick and their neighbours), ~half of
    :data:`ESTIMATED`; then the points within a step of the best of those and its
    neighbours. Before, only the rules' pick and its neighbours were estimated, and at
    light load the rules pick the largest workers: a 1,024-GPU pool started on
    ``128xCP8`` and split for minutes (docs/benchmarks/adaptive.md, "A change must
    stand out of the bursts")."""
    step = math.ceil(len(lattice) / (ESTIMATED // 2))

    def near(c: Composition) -> list[Composition]:
        return planner.neighbours(c, settings.degrees, settings.domain_size)

    first = dict.fromkeys([*lattice[::step], lattice[-1], ruled, *near(ruled)])
    best, found = whatif.best_of(table, list(first), params)
    i = lattice.index(best) if best in lattice else None  # a neighbour may lie outside
    around = [] if i is None else lattice[max(0, i - step + 1) : i + step]
    second = [c for c in dict.fromkeys([*around, *near(best)]) if c not in first]
    return found + (whatif.best_of(table, second, params)[1] if second else [])


def history_requests(
    requests: Iterable[Request], block_size: int, history_s: float | None = None
) -> list[planner.HistoryRequest]:
    """The planner's view of the first ``history_s`` seconds of ``requests`` (all if None).

    Cached tokens are estimated as an ideal global cache would see them
    (blocks seen earlier in the history), i.e. the reuse placement can at
    best achieve.
    """
    out: list[planner.HistoryRequest] = []
    seen: set[int] = set()
    t_end = math.inf
    for r in requests:
        if not out and history_s is not None:
            t_end = r.arrival_s + history_s
        if r.arrival_s >= t_end:
            break
        n = 0
        for k in r.block_keys:
            if k not in seen:
                break
            n += 1
        seen.update(r.block_keys)
        out.append(
            planner.HistoryRequest(r.arrival_s, r.length, cached_tokens(n, r.length, block_size))
        )
    return out
