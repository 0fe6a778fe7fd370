"""``llm-d``: the llm-d inference scheduler (Gateway API Inference Extension EPP).

Sources:

- Profile and weights: the llm-d "inference-scheduling" well-lit path /
  ``optimized-baseline`` EndpointPickerConfig — ``prefix-cache-scorer``
  weight **3**, ``queue-scorer`` weight **2**, ``kv-cache-utilization-scorer``
  weight **2**, ``max-score-picker`` (the precise guide uses the same 3/2/2
  with ``precise-prefix-cache-scorer``). Newer profiles add a
  ``no-hit-lru-scorer`` (weight 2); the issue asks for the three scorers, so
  it is left out.
- Approximate prefix scorer (the default mode): gateway-api-inference-extension
  ``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go`` — the prompt
  is cut into blocks of ``DefaultBlockSizeTokens = 16`` tokens, at most
  ``DefaultMaxPrefixBlocks = 256`` blocks are hashed (4 096 tokens), score =
  matched blocks / hashed blocks; after a pick (``PreRequest``) the hashes are
  added to the chosen pod's LRU, ``DefaultLRUCapacityPerServer = 31 250``
  blocks (500 000 tokens).
- Precise mode: llm-d-inference-scheduler ``precise-prefix-cache-scorer``
  (kv-cache manager fed by the engines' KV events) — per-pod longest cached
  prefix in blocks, then ``indexedScoresToNormalizedScoredPods``: min-max over
  the pods that have a hit (all equal → 1), pods without a hit 0.
- ``queue-scorer``: ``(max − q) / (max − min)`` of the waiting-queue size, all
  equal → 1. ``kv-cache-utilization-scorer``: ``1 − KVCacheUsagePercent``.

Mapping to our block size: token budgets are kept in tokens and converted, so
the approximate scorer hashes ``4096 // block_size`` blocks (8 for 512-token
blocks) and remembers ``500_000 // block_size`` blocks per worker (976).

State kept, as in reality: approximate mode — a per-worker prefix LRU built
from its own picks (:meth:`observe_placed`); precise mode — the exact cached
prefixes (``pool.matched_blocks``, i.e. KV events). Queue size is the scraped
``WaitingQueueSize`` (``WorkerState.queued``). KV-cache usage is what vLLM
reports: blocks held by running requests over capacity (cached-but-free
blocks count as free), so here the running request's blocks over
``cache_capacity_blocks``; the policy tracks which request runs from its own
placements (FIFO per worker). Degree-blind.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from vertumnus.core.decision import RouteDecision
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import PoolView
from vertumnus.core.policies.framework import (
    MaxScorePicker,
    ScoringPolicy,
    Weighted,
    min_max,
    min_max_inverted,
)
from vertumnus.core.policies.peers._index import WorkerLRUIndex
from vertumnus.core.types import Request

APPROXIMATE = "approximate"
PRECISE = "precise"


class ApproxPrefixScorer:
    """GIE ``prefix-cache-scorer``: fraction of the (capped) prompt blocks in the pod's LRU."""

    def __init__(
        self, max_prefix_tokens: int = 256 * 16, lru_capacity_tokens: int = 31_250 * 16
    ) -> None:
        self.max_prefix_tokens = max_prefix_tokens
        self.lru_capacity_tokens = lru_capacity_tokens
        self.index: WorkerLRUIndex | None = None

    def _index(self, block_size: int) -> WorkerLRUIndex:
        if self.index is None:
            self.index = WorkerLRUIndex(max(1, self.lru_capacity_tokens // block_size))
        return self.index

    def hashed(self, request: Request, block_size: int) -> tuple[int, ...]:
        # The plugin hashes only whole blocks, up to the cap.
        n = min(request.length // block_size, max(1, self.max_prefix_tokens // block_size))
        return request.block_keys[:n]

    def score(
        self, request: Request, pool: PoolView, workers: Sequence[WorkerState]
    ) -> dict[int, float]:
        keys = self.hashed(request, pool.block_size)
        if not keys:
            return {w.id: 0.0 for w in workers}
        depths = self._index(pool.block_size).matched(keys)
        total = len(keys)
        return {w.id: depths.get(w.id, 0) / total for w in workers}

    def record(self, request: Request, worker: int, block_size: int) -> None:
        keys = self.hashed(request, block_size)
        if keys:
            self._index(block_size).insert(worker, keys)


class PrecisePrefixScorer:
    """llm-d ``precise-prefix-cache-scorer``: exact cached blocks, min-max over pods with a hit."""

    def score(
        self, request: Request, pool: PoolView, workers: Sequence[WorkerState]
    ) -> dict[int, float]:
        matched = pool.matched_blocks(request)
        hits = {w.id: float(matched[w.id]) for w in workers if matched.get(w.id, 0) > 0}
        normed = min_max(hits)
        return {w.id: normed.get(w.id, 0.0) for w in workers}


class QueueScorer:
    """GIE ``queue-scorer``: min-max of the waiting queue, inverted."""

    def score(
        self, request: Request, pool: PoolView, workers: Sequence[WorkerState]
    ) -> dict[int, float]:
        return min_max_inverted({w.id: float(w.queued) for w in workers})


class KVCacheUtilizationScorer:
    """GIE ``kv-cache-utilization-scorer``: 1 − KV-cache usage of running requests."""

    def __init__(self) -> None:
        # Per worker, the blocks of its placed-and-unfinished requests in
        # placement (FIFO) order: the first one is the one running.
        self.inflight: dict[int, OrderedDict[int, int]] = {}
        self._where: dict[int, int] = {}

    def usage(self, w: WorkerState) -> float:
        q = self.inflight.get(w.id)
        if not w.running or not q or w.cache_capacity_blocks <= 0:
            return 0.0
        return min(1.0, next(iter(q.values())) / w.cache_capacity_blocks)

    def score(
        self, request: Request, pool: PoolView, workers: Sequence[WorkerState]
    ) -> dict[int, float]:
        return {w.id: 1.0 - self.usage(w) for w in workers}

    def placed(self, request: Request, worker: int) -> None:
        self.completed(request)  # re-placed by the shell: forget the old spot
        self.inflight.setdefault(worker, OrderedDict())[request.id] = len(request.block_keys)
        self._where[request.id] = worker

    def completed(self, request: Request) -> None:
        worker = self._where.pop(request.id, None)
        if worker is not None:
            self.inflight[worker].pop(request.id, None)


class LLMD(ScoringPolicy):
    """llm-d EPP default profile: 3·prefix + 2·queue + 2·kv-cache, max-score picker."""

    def __init__(
        self,
        mode: str = APPROXIMATE,
        prefix_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_cache_weight: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if mode not in (APPROXIMATE, PRECISE):
            raise ValueError(f"llm-d mode must be {APPROXIMATE!r} or {PRECISE!r}, got {mode!r}")
        self.mode = mode
        self.approx = ApproxPrefixScorer() if mode == APPROXIMATE else None
        prefix = self.approx if self.approx is not None else PrecisePrefixScorer()
        self.kv = KVCacheUtilizationScorer()
        super().__init__(
            name="llm-d" if mode == APPROXIMATE else "llm-d-precise",
            scorers=[
                Weighted(prefix, prefix_weight),
                Weighted(QueueScorer(), queue_weight),
                Weighted(self.kv, kv_cache_weight),
            ],
            picker=MaxScorePicker(rng if rng is not None else random.Random(0)),
        )

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        worker = decision.worker
        if self.approx is not None:
            self.approx.record(request, worker, pool.block_size)
        self.kv.placed(request, worker)

    def observe_completed(self, request: Request, worker: int) -> None:
        self.kv.completed(request)
