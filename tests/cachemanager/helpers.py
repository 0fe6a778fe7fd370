"""Small hand-built pools for the cache-manager tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.placement import WorkerState
from vertumnus.core.store import BlockInfo, TrieStore
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Request

# Round numbers so marginal benefits can be computed by hand:
# E_C(R, P) = d_C + a·R + (c·R + α·W(R, P)) / C
MODEL = PrefillModel(
    name="hand",
    alpha=0.001,
    c=0.01,
    b=0.0,
    d={4: 0.1, 8: 0.2},
    a={4: 0.002, 8: 0.002},
    max_tokens_per_gpu=1 << 20,
)


@dataclass
class View:
    """A CacheView (a PoolView) over explicit state."""

    workers: Sequence[WorkerState]
    store: PrefixTrie = field(default_factory=PrefixTrie)
    model: PrefillModel = MODEL
    block_size: int = 4

    def worker(self, worker_id: int) -> WorkerState:
        return next(w for w in self.workers if w.id == worker_id)

    def matched_blocks(self, request: Request) -> Mapping[int, int]:
        return self.store.matched_blocks(request.block_keys)

    def inflight_blocks(self, request: Request) -> Mapping[int, int]:
        return {}


def workers(*degrees: int, capacity: int = 100) -> list[WorkerState]:
    return [
        WorkerState(id=i, degree=d, cache_capacity_blocks=capacity) for i, d in enumerate(degrees)
    ]


def placed(worker: int, preferred_degree: int) -> RouteDecision:
    """A placement decision at ``worker`` with C_pref = ``preferred_degree``."""
    return RouteDecision(worker, 0.0, 0, preferred_degree)


def hold(store: TrieStore, worker: int, path: Iterable[int]) -> list[BlockInfo]:
    """Worker ``worker`` caches the prefix ``path`` (keys root first); its blocks."""
    keys = list(path)
    store.apply(worker, [(k, i, keys[i - 1] if i else None) for i, k in enumerate(keys)])
    return list(store.path(keys))


def all_keys(store: TrieStore) -> list[int]:
    """Every block some worker holds, sorted."""
    return sorted({k for w in store.workers() for k in store.worker_keys(w)})


def missing_blocks(store: TrieStore, key: int, worker: int) -> int:
    """Blocks of the root→``key`` path that ``worker`` lacks (the copy
    footprint), by the plain walk up to the deepest ancestor it holds."""
    block = store.block(key)
    assert block is not None
    m = block
    while m is not None:
        if worker in m.holders:
            return block.depth - m.depth
        m = store.block(m.parent)
    return block.depth
