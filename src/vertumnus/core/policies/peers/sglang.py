"""``sglang-cache-aware``: SGLang router's cache-aware load balancing.

Source: sgl-project/sglang, ``sgl-router/src/policies/cache_aware.rs``
(``CacheAwarePolicy::select_worker`` and the header comment), its approximate
radix tree ``sgl-router/src/tree.rs`` (``prefix_match``, ``insert``,
``get_smallest_tenant``, ``evict_tenant_by_size``), and the router's CLI
defaults (``launch_router.py`` / ``main.rs``): ``cache_threshold = 0.3``,
``balance_abs_threshold = 64``, ``balance_rel_threshold = 1.5``,
``eviction_interval = 120 s``, ``max_tree_size = 67_108_864`` (characters per
tenant).

Rule, per request:

1. ``load`` is the router's in-flight request count per worker. The pool is
   **imbalanced** iff ``max − min > balance_abs`` **and**
   ``max > balance_rel · min`` (both strict). Then the least-loaded worker
   wins.
2. Otherwise, match the prompt against the approximate tree: the longest
   prefix any worker is believed to hold. If ``matched / total >
   cache_threshold`` (strict) that worker wins, else the worker with the
   **smallest tree** (most free cache, as the router believes).
3. Either way the prompt is inserted into the chosen worker's tree.

State kept, as in reality: the in-flight counts (here ``WorkerState.inflight``,
which the router maintains by counting) and a per-worker approximate tree
built only from its own routing decisions (:meth:`observe_placed`). The real
tree stores characters; we store the request's blocks, and convert
``max_tree_size`` characters to blocks at 4 characters per token (llm-d's and
AIBrix's estimate): 67_108_864 / (4 · 512) = 32 768 blocks per worker for
512-token blocks. Eviction mimics the router's background thread: every
``eviction_interval_s`` of trace time each worker's tree is cut back to
``max_tree_size`` by removing least recently used leaves. Between sweeps a
tree may grow past the limit, as in SGLang. Ties for the best match (several
workers hold the deepest node; the Rust code takes whichever its hash map
yields first) are broken with the seeded ``rng``.
"""

from __future__ import annotations

import random

from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.policies.peers._index import WorkerLRUIndex
from vertumnus.core.types import Request

CHARS_PER_TOKEN = 4


class SGLangCacheAware(Policy):
    name = "sglang-cache-aware"

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size_chars: int = 67_108_864,
        rng: random.Random | None = None,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size_chars = max_tree_size_chars
        self.rng = rng if rng is not None else random.Random(0)
        self.tree = WorkerLRUIndex(capacity=None)
        self._next_eviction_s = eviction_interval_s

    def max_tree_blocks(self, block_size: int) -> int:
        return max(1, self.max_tree_size_chars // (CHARS_PER_TOKEN * block_size))

    def _maybe_evict(self, now: float, block_size: int) -> None:
        if self.eviction_interval_s <= 0 or now < self._next_eviction_s:
            return
        keep = self.max_tree_blocks(block_size)
        for w in self.tree.workers():
            self.tree.evict(w, keep)
        # The sweep runs on a fixed period; skip the periods with no arrival.
        periods = int((now - self._next_eviction_s) // self.eviction_interval_s) + 1
        self._next_eviction_s += periods * self.eviction_interval_s

    def is_imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        if not cands:
            return None
        self._maybe_evict(request.arrival_s, pool.block_size)
        if self.is_imbalanced([w.inflight for w in cands]):
            return decision_at(request, min(cands, key=lambda w: (w.inflight, w.id)).id, pool)
        ids = {w.id for w in cands}
        depths = {w: d for w, d in self.tree.matched(request.block_keys).items() if w in ids}
        best_depth = max(depths.values(), default=0)
        matched_tokens = min(best_depth * pool.block_size, request.length)
        if best_depth > 0 and matched_tokens / request.length > self.cache_threshold:
            tied = sorted(w for w, d in depths.items() if d == best_depth)
            return decision_at(
                request, tied[self.rng.randrange(len(tied))] if len(tied) > 1 else tied[0], pool
            )
        return decision_at(request, min(cands, key=lambda w: (self.tree.size(w.id), w.id)).id, pool)

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        worker = decision.worker
        self.tree.insert(worker, request.block_keys)
