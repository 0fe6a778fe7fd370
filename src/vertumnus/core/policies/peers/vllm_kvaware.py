"""``vllm-kvaware``: vLLM production-stack's ``kvaware`` router.

Source: vllm-project/production-stack ``src/vllm_router/routers/routing_logic.py``
(``KvawareRouter.route_request``, ``kv_aware_threshold = 2000``;
fallback ``SessionRouter`` / ``_qps_routing``) and the router's
``--request-stats-window`` (60 s) over which per-engine QPS is measured.

Rule: ask the LMCache controller which instance holds the longest prefix of
the prompt. If some instance holds one and ``matched_tokens >= max(len −
2000, 0)``, send the request there — however busy it is. Otherwise fall back:
hash the session id onto a ring if the request carries one (our traces carry
none), else **lowest QPS**: an engine that has never been sent a request is
taken at once, else the one with the fewest requests routed in the last
window.

State kept, as in reality: the LMCache controller's cache index, which the
LMCache workers keep current by reporting admissions and evictions — exact
state, so ``pool.matched_blocks`` (the brief's "approximate tree from its own
routing decisions" describes the older ``prefixaware`` router, not
``kvaware``); and the router's request stats (arrival times of the requests
it routed to each engine, from :meth:`observe_placed`). Ties for the longest
match go to the lowest worker id (the controller returns one instance).
"""

from __future__ import annotations

from collections import deque

from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.types import Request


class VLLMKvaware(Policy):
    name = "vllm-kvaware"

    def __init__(self, kv_aware_threshold: int = 2000, qps_window_s: float = 60.0) -> None:
        self.kv_aware_threshold = kv_aware_threshold
        self.qps_window_s = qps_window_s
        self._routed: dict[int, deque[float]] = {}

    def qps(self, worker: int, now: float) -> float:
        q = self._routed.get(worker)
        if q is None:
            return 0.0
        horizon = now - self.qps_window_s
        while q and q[0] < horizon:
            q.popleft()
        return len(q) / self.qps_window_s

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        if not cands:
            return None
        ids = {w.id for w in cands}
        matched = {w: d for w, d in pool.matched_blocks(request).items() if w in ids and d > 0}
        if matched:
            best = max(matched.values())
            owner = min(w for w, d in matched.items() if d == best)
            matched_tokens = min(best * pool.block_size, request.length)
            if matched_tokens >= max(request.length - self.kv_aware_threshold, 0):
                return decision_at(request, owner, pool)
        for w in sorted(cands, key=lambda w: w.id):
            if w.id not in self._routed:
                return decision_at(request, w.id, pool)
        now = request.arrival_s
        return decision_at(request, min(cands, key=lambda w: (self.qps(w.id, now), w.id)).id, pool)

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        worker = decision.worker
        self._routed.setdefault(worker, deque()).append(request.arrival_s)
