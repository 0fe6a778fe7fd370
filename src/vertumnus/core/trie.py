"""The global prefix trie: which worker holds which cached prefix (design.md section 6).

Node z is one cache block; the root→z path is the prefix ending at z. A
worker is a **holder** of z when it caches the whole prefix root→z. The trie
is built from the cache events workers publish (block stored with its
parent, block removed) and answers, for an arriving request, how many of its
leading blocks each worker holds — in O(blocks in the request + holders on the
path), never O(trie).

Nodes are kept while some worker holds them or they have children; a node
that loses its last holder and has no children is dropped, and so on upwards.
The cache manager (``vertumnus.core.cachemanager``) keeps its per-node
counters on the nodes themselves (``stats``) and learns which nodes were
dropped from a :class:`RemovalLog` (:meth:`PrefixTrie.removal_log`) instead of
checking every node it tracks at each scan.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import takewhile
from operator import is_not
from typing import Any, cast

# A C-level "is not None" for takewhile in match(); a constant, not state.
_is_node = partial(is_not, None)


class TrieNode:
    __slots__ = ("key", "parent", "depth", "children", "holders", "stats")

    def __init__(self, key: int, parent: TrieNode | None) -> None:
        self.key = key
        self.parent = parent
        self.depth: int = 1 if parent is None else parent.depth + 1
        """Blocks on the root→z path, z included (the prefix length in blocks)."""
        self.children: dict[int, TrieNode] = {}
        self.holders: set[int] = set()
        self.stats: Any = None

    def __repr__(self) -> str:
        return f"TrieNode(depth={self.depth}, holders={sorted(self.holders)})"


class RemovalLog:
    """The nodes a trie dropped (``nodes``, in order) since the consumer last
    emptied the list.

    A node is dropped when it loses its last holder and has no children; a
    key that comes back later is a new :class:`TrieNode`. The trie holds its
    logs weakly, so a consumer that goes away stops being fed.
    """

    __slots__ = ("nodes", "__weakref__")

    def __init__(self) -> None:
        self.nodes: list[TrieNode] = []


class PrefixTrie:
    """Global index of cached prefixes across workers."""

    __slots__ = ("nodes", "roots", "_removal_logs")

    def __init__(self) -> None:
        self.nodes: dict[int, TrieNode] = {}
        self.roots: dict[int, TrieNode] = {}
        self._removal_logs: weakref.WeakSet[RemovalLog] | None = None

    def removal_log(self) -> RemovalLog:
        """A new log that every node this trie drops from now on is appended to.

        For a consumer that keeps state per node (the cache manager's
        counters) and must forget a node once it leaves, without checking all
        of its nodes periodically; it empties ``log.nodes`` itself. Only the
        rare drop path pays for this: lookups, ``stored`` and a ``removed``
        that keeps the node are unchanged.
        """
        log = RemovalLog()
        if self._removal_logs is None:
            self._removal_logs = weakref.WeakSet()
        self._removal_logs.add(log)
        return log

    def __len__(self) -> int:
        return len(self.nodes)

    # -- events ---------------------------------------------------------------

    def stored(self, worker: int, key: int, parent_key: int | None) -> TrieNode:
        """Worker ``worker`` now caches the prefix ending at ``key``."""
        node = self.nodes.get(key)
        if node is None:
            parent = None
            if parent_key is not None:
                parent = self.nodes.get(parent_key)
                if parent is None:
                    raise ValueError(
                        f"block {key:#x} stored by worker {worker} before its parent {parent_key:#x}"
                    )
            node = TrieNode(key, parent)
            self.nodes[key] = node
            (parent.children if parent is not None else self.roots)[key] = node
        node.holders.add(worker)
        return node

    def removed(self, worker: int, key: int) -> None:
        """Worker ``worker`` no longer caches the block ``key``."""
        node = self.nodes.get(key)
        if node is None:
            return
        node.holders.discard(worker)
        self._prune(node)

    def apply(self, worker: int, stored: Iterable[tuple[int, int | None]], removed: Iterable[int]) -> None:
        for key, parent in stored:
            self.stored(worker, key, parent)
        for key in removed:
            self.removed(worker, key)

    def drop_worker(self, worker: int) -> None:
        """Forget everything ``worker`` held (it left the pool or lost its cache)."""
        for node in [n for n in self.nodes.values() if worker in n.holders]:
            node.holders.discard(worker)
        for node in [n for n in self.nodes.values() if not n.holders and not n.children]:
            self._prune(node)

    def _prune(self, node: TrieNode | None) -> None:
        while node is not None and not node.holders and not node.children and node.key in self.nodes:
            del self.nodes[node.key]
            parent = node.parent
            (parent.children if parent is not None else self.roots).pop(node.key, None)
            if self._removal_logs is not None:
                for log in self._removal_logs:
                    log.nodes.append(node)
            node = parent

    # -- queries --------------------------------------------------------------

    def match(self, keys: Sequence[int]) -> list[TrieNode]:
        """MatchedPath: the nodes of the longest prefix of ``keys`` present in
        the trie, whoever holds them."""
        # Lookups stop at the first miss; takewhile/map keep the loop in C.
        get: Callable[[int], TrieNode | None] = self.nodes.get
        return cast(list[TrieNode], list(takewhile(_is_node, map(get, keys))))

    @staticmethod
    def holder_depths(path: Sequence[TrieNode]) -> dict[int, int]:
        """Per worker, how many leading blocks of ``path`` it holds."""
        depths: dict[int, int] = {}
        # Consecutive nodes usually have the same holders (a conversation's
        # blocks live on the same workers), so write each run of equal
        # holder sets once, at its deepest node: the same result as writing
        # every node (deeper nodes overwrite), with one C-level update per run.
        run: set[int] | None = None
        run_depth = 0
        for node in path:
            holders = node.holders
            if not holders:
                # A holder of a deeper node holds this one too, so an empty
                # holder set means nobody holds anything deeper.
                break
            if run is not None and holders != run:
                depths.update(dict.fromkeys(run, run_depth))
            run, run_depth = holders, node.depth
        if run is not None:
            depths.update(dict.fromkeys(run, run_depth))
        return depths

    def matched_blocks(self, keys: Sequence[int]) -> dict[int, int]:
        """``holder_depths(match(keys))`` in one pass: per worker, how many
        leading blocks of ``keys`` it holds."""
        # Placement's hot path (issue 4): fusing the two saves building the
        # path list and a second loop over it (~15 % of this call on the
        # bench/placement_speed.py trie). Same rules as holder_depths (runs of
        # equal holder sets are written once, at their deepest node; stop at
        # the first miss or the first node nobody holds), but the run's
        # deepest node is remembered rather than its depth read at every
        # node; tests/policies/test_hot_path.py checks the two agree.
        get = self.nodes.get
        depths: dict[int, int] = {}
        run: set[int] | None = None
        last: TrieNode | None = None  # the deepest node of the current run
        for node in map(get, keys):  # map(): the lookups run in C
            if node is None:
                break
            holders = node.holders
            if not holders:
                break
            if holders != run:
                if last is not None:
                    depths.update(dict.fromkeys(last.holders, last.depth))
                run = holders
            last = node
        if last is not None:
            depths.update(dict.fromkeys(last.holders, last.depth))
        return depths
