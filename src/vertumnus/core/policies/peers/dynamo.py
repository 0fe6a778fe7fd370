"""``dynamo-kv``: NVIDIA Dynamo's KV router.

Sources: ai-dynamo/dynamo ``docs/router/kv_cache_routing.md`` ("KV Router
Architecture", "Cost Calculation") and the scheduler's cost code
(``lib/llm/src/kv_router/scheduler.rs``, later
``lib/kv-router/src/scheduling/selector.rs``, ``DefaultWorkerSelector``)::

    potential_prefill_blocks = (active_prefill_tokens[w] + isl − overlap[w]·block_size) / block_size
    potential_decode_blocks  = active_blocks[w] + request_blocks
    logit[w] = overlap_score_weight · potential_prefill_blocks + potential_decode_blocks

lowest logit wins; ``softmax_sample`` with ``router_temperature`` (default
0: argmin, ties uniformly at random). Defaults: ``--kv-overlap-score-weight
1``, ``--router-temperature 0``, KV events on (exact overlaps), no busy
threshold.

State kept, as in reality: the exact global radix tree from KV events —
``pool.matched_blocks`` — and the router's own active-sequence accounting
(``ActiveSequences``): a request's uncached prompt tokens count as active
prefill from routing until its prefill finishes, and its blocks count as
active blocks until it leaves the worker. This pool only prefills, so a
request leaves when its prefill completes (:meth:`observe_completed`).
Degree-blind: a block costs the same on every worker.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.types import Request


@dataclass(slots=True)
class _Active:
    worker: int
    prefill_tokens: int
    blocks: int


class DynamoKV(Policy):
    name = "dynamo-kv"

    def __init__(
        self,
        overlap_score_weight: float = 1.0,
        temperature: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if temperature < 0:
            raise ValueError(f"router temperature must be >= 0, got {temperature}")
        self.overlap_score_weight = overlap_score_weight
        self.temperature = temperature
        self.rng = rng if rng is not None else random.Random(0)
        self.prefill_tokens: dict[int, int] = {}
        self.active_blocks: dict[int, int] = {}
        self._booked: dict[int, _Active] = {}

    def logits(self, request: Request, pool: PoolView) -> dict[int, float]:
        cands = eligible(request, pool)
        if not cands:
            return {}
        bs = pool.block_size
        overlaps = pool.matched_blocks(request)
        request_blocks = len(request.block_keys)
        out: dict[int, float] = {}
        for w in cands:
            new_tokens = max(0, request.length - overlaps.get(w.id, 0) * bs)
            prefill_blocks = (self.prefill_tokens.get(w.id, 0) + new_tokens) / bs
            decode_blocks = self.active_blocks.get(w.id, 0) + request_blocks
            out[w.id] = self.overlap_score_weight * prefill_blocks + decode_blocks
        return out

    def sample(self, logits: dict[int, float]) -> int:
        """Dynamo's ``softmax_sample``: argmin at temperature 0, else softmax of −logit/T."""
        ids = sorted(logits)
        if self.temperature == 0.0:
            best = min(logits.values())
            tied = [w for w in ids if logits[w] == best]
            return tied[self.rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
        # Logits are normalised by their range before the softmax, as in the source.
        lo, hi = min(logits.values()), max(logits.values())
        span = hi - lo if hi > lo else 1.0
        weights = [math.exp(-((logits[w] - lo) / span) / self.temperature) for w in ids]
        return self.rng.choices(ids, weights=weights)[0]

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        logits = self.logits(request, pool)
        return decision_at(request, self.sample(logits), pool) if logits else None

    def _release(self, request_id: int) -> None:
        booked = self._booked.pop(request_id, None)
        if booked is not None:
            self.prefill_tokens[booked.worker] -= booked.prefill_tokens
            self.active_blocks[booked.worker] -= booked.blocks

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        worker = decision.worker
        # A request re-placed by the shell (its worker drained) moves its
        # booking: Dynamo frees a sequence's slots when it is re-routed.
        self._release(request.id)
        overlap = pool.matched_blocks(request).get(worker, 0)
        booked = _Active(
            worker, max(0, request.length - overlap * pool.block_size), len(request.block_keys)
        )
        self._booked[request.id] = booked
        self.prefill_tokens[worker] = self.prefill_tokens.get(worker, 0) + booked.prefill_tokens
        self.active_blocks[worker] = self.active_blocks.get(worker, 0) + booked.blocks

    def observe_completed(self, request: Request, worker: int) -> None:
        self._release(request.id)
