"""A tiny fake pool for policy tests: the smallest thing that implements ``PoolView``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import Policy, decision_at
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Request

BS = 4
"""Block size of the fake pools: 4 tokens, so hand computations stay small."""


def toy_model() -> PrefillModel:
    return PrefillModel(
        name="toy",
        alpha=1e-9,
        c=1e-5,
        b=0.0,
        d={1: 0.01, 2: 0.01, 4: 0.02, 8: 0.04},
        a={1: 1e-5, 2: 1e-5, 4: 1e-5, 8: 1e-5},
    )


@dataclass
class FakePool:
    workers: list[WorkerState]
    model: PrefillModel = field(default_factory=toy_model)
    block_size: int = BS
    matched: dict[int, int] = field(default_factory=dict)
    """Exact cached leading blocks per worker, as KV events would report."""
    store: PrefixTrie = field(default_factory=PrefixTrie)
    """Unused by the fake's matches (``matched`` answers); there for the protocol."""

    def worker(self, worker_id: int) -> WorkerState:
        return next(w for w in self.workers if w.id == worker_id)

    def matched_blocks(self, request: Request) -> Mapping[int, int]:
        return self.matched

    def inflight_blocks(self, request: Request) -> Mapping[int, int]:
        return {}


def observe(policy: Policy, request: Request, worker: int, pool: FakePool) -> None:
    """Tell ``policy`` that ``request`` was placed at ``worker`` (by whatever rule)."""
    policy.observe_placed(request, decision_at(request, worker, pool), pool)


def pool(n: int = 2, degree: int = 4, **kw) -> FakePool:
    return FakePool(
        [WorkerState(id=i, degree=degree, cache_capacity_blocks=100) for i in range(n)], **kw
    )


def req(rid: int, keys: tuple[int, ...], length: int | None = None, t: float = 0.0) -> Request:
    return Request(rid, t, length if length is not None else len(keys) * BS, keys)
