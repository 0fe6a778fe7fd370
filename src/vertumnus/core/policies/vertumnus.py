"""Vertumnus placement: the CP-aware cost model of design.md section 3."""

from __future__ import annotations

from vertumnus.core.placement import PlacementParams, place
from vertumnus.core.policies.base import Decision, Policy, PoolView
from vertumnus.core.types import Request


class CostModelPolicy(Policy):
    """cost = q_w + β·Ê + λ·(C_w/C_min − 1)·Ê over exact cached prefixes."""

    name = "vertumnus"

    def __init__(self, params: PlacementParams | None = None) -> None:
        self.params = params or PlacementParams()

    def decide(self, request: Request, pool: PoolView) -> Decision | None:
        p = place(
            request.length,
            pool.matched_blocks(request),
            pool.workers,
            pool.model,
            self.params,
            pool.block_size,
        )
        return None if p is None else Decision(p.worker, p.preferred_degree)
