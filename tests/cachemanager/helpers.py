"""Small hand-built pools for the cache-manager tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import WorkerState
from vertumnus.core.trie import PrefixTrie, TrieNode

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
    """A CacheView over explicit state."""

    workers: Sequence[WorkerState]
    trie: PrefixTrie = field(default_factory=PrefixTrie)
    model: PrefillModel = MODEL
    block_size: int = 4


def workers(*degrees: int, capacity: int = 100) -> list[WorkerState]:
    return [
        WorkerState(id=i, degree=d, cache_capacity_blocks=capacity) for i, d in enumerate(degrees)
    ]


def hold(trie: PrefixTrie, worker: int, path: Iterable[int]) -> list[TrieNode]:
    """Worker ``worker`` caches the prefix ``path`` (keys root first)."""
    parent = None
    nodes = []
    for k in path:
        nodes.append(trie.stored(worker, k, parent))
        parent = k
    return nodes


def missing_blocks(node: TrieNode, worker: int) -> int:
    """Blocks of the root→``node`` path that ``worker`` lacks (the copy
    footprint), by the plain walk up to the deepest ancestor it holds."""
    m: TrieNode | None = node
    while m is not None:
        if worker in m.holders:
            return node.depth - m.depth
        m = m.parent
    return node.depth
