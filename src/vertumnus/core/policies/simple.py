"""Simple baselines: round-robin, least outstanding work, length-only, cache-first."""

from __future__ import annotations

from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible, least_loaded
from vertumnus.core.types import Request


class RoundRobin(Policy):
    """Each request to the next eligible worker in id order."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = sorted(eligible(request, pool), key=lambda w: w.id)
        if not cands:
            return None
        # The first eligible worker at or after the cursor, wrapping around.
        pick = next((w for w in cands if w.id >= self._next), cands[0])
        self._next = pick.id + 1
        return decision_at(request, pick.id, pool)


class LeastWork(Policy):
    """The worker with the least outstanding predicted work (q_w), cache-blind."""

    name = "least-work"

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        return decision_at(request, least_loaded(cands).id, pool) if cands else None


class LengthOnly(Policy):
    """Long prompts to the largest degree, the rest to the smallest; least work inside a degree."""

    name = "length-only"

    def __init__(self, long_threshold: int = 32768) -> None:
        self.long_threshold = long_threshold

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        if not cands:
            return None
        pick = max if request.length > self.long_threshold else min
        degree = pick(w.degree for w in cands)
        return decision_at(request, least_loaded([w for w in cands if w.degree == degree]).id, pool)


class CacheFirst(Policy):
    """The worker holding the longest cached prefix; least work among equals."""

    name = "cache-first"

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        if not cands:
            return None
        matched = pool.matched_blocks(request)
        best = max(cands, key=lambda w: (matched.get(w.id, 0), -w.outstanding_s, -w.id))
        return decision_at(request, best.id, pool)
