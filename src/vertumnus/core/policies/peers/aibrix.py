"""``aibrix-conductor``: AIBrix's PD-router ``conductor`` prefill scorer.

Source: vllm-project/aibrix ``pkg/plugins/gateway/algorithms/pd/prefill_scorer.go``
(``conductorScorer.ScorePod``; defaults ``DefaultPrefixTimeCoeffA = 0.005``,
``DefaultPrefixTimeCoeffB = 1.0``, ``DefaultPrefillTimeCoeffA = 0.001``,
``DefaultPrefillTimeCoeffB = 1.5``, ``DefaultPrefillTimeCoeffC = 5.0``) and the
prefix index ``pkg/utils/prefixcacheindexer`` (``defaultPrefixCacheBlockNumber =
200000`` blocks of ``defaultPrefixCacheBlockSize = 16`` tokens,
``defaultPrefixCacheEvictionDurationInMins = 20``)::

    estimated_TTFT_ms(pod) = reqCnt · avgPrefillMs
                           + (0.005 · matched + 1)            if matched > 0
                           + (0.001 · unmatched^1.5 + 5)      if unmatched > 0

with matched = total · matchPct / 100 (matchPct an integer percentage of the
prompt's blocks found for the pod); lowest wins.

State kept, as in reality: per-pod request counts (the PD router's
``PrefillRequestTracker``: routed, prefill not finished —
``WorkerState.inflight``), and the prefix-hash table, which is written after
each pick with the request's hashes (:meth:`observe_placed`) — approximate,
shared LRU of 200 000 × 16 = 3.2 M tokens (6 250 blocks of 512 tokens),
entries expire after 20 minutes unused (swept once per second in AIBrix; here
expired entries are ignored on lookup and swept every minute of trace time).

``avgPrefillMs`` is the mean of the pod's ``RequestPrefillTimeSeconds``
histogram, falling back to ``estimatePrefill(512)`` = 16.6 ms while a pod has
no samples. Our PoolView exposes no measured durations, so after the first
completion on a pod we use the conductor's own prefill model over the
requests the pod completed (what the histogram would read if the model were
right). This keeps the peer degree-blind, as AIBrix's model is.
Ties go to the lowest worker id.
"""

from __future__ import annotations

from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.policies.peers._index import GlobalTTLIndex
from vertumnus.core.types import Request


class AIBrixConductor(Policy):
    name = "aibrix-conductor"

    def __init__(
        self,
        prefix_a: float = 0.005,
        prefix_b: float = 1.0,
        prefill_a: float = 0.001,
        prefill_b: float = 1.5,
        prefill_c: float = 5.0,
        index_capacity_tokens: int = 200_000 * 16,
        index_ttl_s: float = 20 * 60.0,
        sweep_interval_s: float = 60.0,
    ) -> None:
        self.prefix_a, self.prefix_b = prefix_a, prefix_b
        self.prefill_a, self.prefill_b, self.prefill_c = prefill_a, prefill_b, prefill_c
        self.index_capacity_tokens = index_capacity_tokens
        self.index_ttl_s = index_ttl_s
        self.sweep_interval_s = sweep_interval_s
        self.index: GlobalTTLIndex | None = None
        self._next_sweep_s = sweep_interval_s
        self._now = 0.0
        # Per pod: (sum of estimated prefill ms, count) of completed requests.
        self._prefill_ms: dict[int, tuple[float, int]] = {}
        self._estimate: dict[int, float] = {}

    def estimate_prefix(self, matched: float) -> float:
        return self.prefix_a * matched + self.prefix_b if matched > 0 else 0.0

    def estimate_prefill(self, unmatched: float) -> float:
        return self.prefill_a * unmatched**self.prefill_b + self.prefill_c if unmatched > 0 else 0.0

    def avg_prefill_ms(self, worker: int) -> float:
        total, n = self._prefill_ms.get(worker, (0.0, 0))
        return total / n if n else self.estimate_prefill(512)

    def _index(self, block_size: int) -> GlobalTTLIndex:
        if self.index is None:
            self.index = GlobalTTLIndex(
                max(1, self.index_capacity_tokens // block_size), self.index_ttl_s
            )
        return self.index

    def match_pct(self, request: Request, pool: PoolView) -> dict[int, int]:
        keys = request.block_keys
        depths = self._index(pool.block_size).matched(keys, request.arrival_s)
        return {w: d * 100 // len(keys) for w, d in depths.items()}

    def scores(self, request: Request, pool: PoolView) -> dict[int, float]:
        cands = eligible(request, pool)
        pct = self.match_pct(request, pool)
        out = {}
        for w in cands:
            matched = request.length * pct.get(w.id, 0) / 100.0
            unmatched = request.length - matched
            queue = w.inflight * self.avg_prefill_ms(w.id) if w.inflight > 0 else 0.0
            out[w.id] = queue + self.estimate_prefix(matched) + self.estimate_prefill(unmatched)
        return out

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        self._now = request.arrival_s
        if request.arrival_s >= self._next_sweep_s and self.index is not None:
            self.index.sweep(request.arrival_s)
            self._next_sweep_s = request.arrival_s + self.sweep_interval_s
        scores = self.scores(request, pool)
        if not scores:
            return None
        return decision_at(request, min(scores, key=lambda w: (scores[w], w)), pool)

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        worker = decision.worker
        pct = self.match_pct(request, pool).get(worker, 0)
        self._estimate[request.id] = self.estimate_prefill(request.length * (100 - pct) / 100.0)
        self._index(pool.block_size).insert(worker, request.block_keys, request.arrival_s)

    def observe_completed(self, request: Request, worker: int) -> None:
        est = self._estimate.pop(request.id, None)
        if est is None:
            return
        total, n = self._prefill_ms.get(worker, (0.0, 0))
        self._prefill_ms[worker] = (total + est, n + 1)
