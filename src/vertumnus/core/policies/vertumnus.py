"""Vertumnus placement: the CP-aware cost model of design.md section 3."""

from __future__ import annotations

from vertumnus.core.inflight import InflightPrefixes, merge_matches
from vertumnus.core.placement import PlacementParams, place_fields
from vertumnus.core.policies.base import Decision, Policy, PoolView
from vertumnus.core.types import Request


class CostModelPolicy(Policy):
    """cost = q_w + β·Ê + λ·(C_w/C_min − 1)·Ê.

    P_{i,w} is the longer of the prefix cached at w now (exact, from cache
    events) and the prefix that requests already queued at w will have cached
    by the time this one runs (see :mod:`vertumnus.core.inflight`).
    """

    name = "vertumnus"

    def __init__(self, params: PlacementParams | None = None) -> None:
        self.params = params or PlacementParams()
        self.inflight = InflightPrefixes()

    def decide(self, request: Request, pool: PoolView) -> Decision | None:
        matched = pool.matched_blocks(request)
        # Merge (one copy of the cached matches) only when some request in
        # flight shares a prefix with this one; place() only reads `matched`.
        flight = self.inflight.matched_blocks(request.block_keys)
        if flight:
            matched = merge_matches(matched, flight)
        p = place_fields(request.length, matched, pool.workers, pool.model, self.params, pool.block_size)
        if p is None:
            return None
        worker, estimate_s, _, _, preferred_degree = p
        return Decision(worker, preferred_degree, estimate_s)

    def observe_placed(self, request: Request, worker: int, pool: PoolView) -> None:
        self.inflight.add(request.id, worker, request.block_keys)

    def observe_completed(self, request: Request, worker: int) -> None:
        self.inflight.remove(request.id)
