"""``least-requests``: the worker with the fewest outstanding requests.

The baseline every router ships (SGLang ``--policy shortest_queue``, AIBrix
``least-request``, Envoy ``LEAST_REQUEST``): count requests routed to a worker
and not yet finished — :attr:`WorkerState.inflight` here — and take the
smallest. Cache-blind and degree-blind. Ties go to the lowest worker id
(deterministic; real routers break them arbitrarily).
"""

from __future__ import annotations

from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.types import Request


class LeastRequests(Policy):
    name = "least-requests"

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        if not cands:
            return None
        return decision_at(request, min(cands, key=lambda w: (w.inflight, w.id)).id, pool)
