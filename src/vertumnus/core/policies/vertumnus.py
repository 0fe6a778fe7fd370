"""Vertumnus placement: the CP-aware cost model of design.md section 3."""

from __future__ import annotations

from vertumnus.core.decision import RouteDecision
from vertumnus.core.inflight import merge_matches
from vertumnus.core.placement import PlacementParams, place_fields
from vertumnus.core.policies.base import Policy, PoolView
from vertumnus.core.types import Request


class CostModelPolicy(Policy):
    """cost = q_w + β·Ê + λ·(C_w/C_min − 1)·Ê.

    P_{i,w} is the longer of the prefix cached at w now (exact, from cache
    events) and the prefix that requests already queued at w will have cached
    by the time this one runs (``pool.inflight_blocks``, see
    :mod:`vertumnus.core.inflight`).
    """

    name = "vertumnus"

    def __init__(self, params: PlacementParams | None = None) -> None:
        self.params = params or PlacementParams()

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        matched = pool.matched_blocks(request)
        # Merge (one copy of the cached matches) only when some request in
        # flight shares a prefix with this one; place() only reads `matched`.
        flight = pool.inflight_blocks(request)
        if flight:
            matched = merge_matches(matched, flight)
        p = place_fields(
            request.length, matched, pool.workers, pool.model, self.params, pool.block_size
        )
        if p is None:
            return None
        worker, estimate_s, cached, cost, preferred_degree = p
        return RouteDecision(
            worker, estimate_s, cached, preferred_degree, cost, pool.worker(worker).outstanding_s
        )
