"""``preble``: Preble's E2 global scheduler (exploit / explore).

Source: WukLab/preble ``multi_node/global_scheduler_with_time.py``
(``GlobalSchedulerWithTime.runtime_selector``, ``SlidingWindowHistogram``,
``get_important_node``, ``is_large_node``); paper: Srivatsa et al., "Preble:
Efficient Distributed Prompt Scheduling for LLM Serving", ICLR 2025, §4
(E2). Defaults from that file: window 3 minutes, ``enable_eviction=False``
(no eviction cost term), important-node stealing (rebalancing) disabled — its
call is commented out in ``runtime_selector``.

Rule, per request:

1. Insert the prompt into a **global radix tree** of every prompt seen (not
   of what is cached). The new leaf holds the part no earlier prompt had.
2. **Exploit** if the leaf is shorter than the already-known part
   (``leaf.num_tokens < context_length − leaf.num_tokens``): route to the
   GPUs allocated to the nearest ancestor that has an allocation; if several,
   the least loaded of them.
3. **Explore** otherwise: the GPU with the least windowed load.
4. Record the request in the window histogram under its **important node**
   (the deepest ancestor-or-self whose own segment is longer than the prefix
   before it) and add the chosen GPUs to the allocation of the leaf and all
   its ancestors. When a node's last request leaves the window its
   allocation is reset.

Windowed load of GPU g = Σ over important nodes allocated to g of
``miss_rate · count · prefill_time(node) / |allocation|`` (plus a decode term
``active · output_len · TPOT``, which is zero in a prefill-only pool). The
miss rate is Preble's own estimate, from the tree at insertion time, not
from real caches. ``prefill_time`` is Preble's profiled equation for one
GPU type; we use the shared prefill-time model at the smallest degree of
the profile, the same for every worker — Preble is degree-blind.

State kept, as in reality: the global tree with per-node GPU allocations and
the sliding-window histogram, both built from its own decisions and the
requests' arrival times. Loads are maintained incrementally so a decision
costs O(blocks in the request + nodes on its path). The tree keeps every
prompt seen (Preble only marks evictions on it), so memory grows with the
trace's distinct prefixes — about 2 nodes per request.
"""

from __future__ import annotations

from collections import deque

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.policies.base import Policy, PoolView, decision_at, eligible
from vertumnus.core.types import Request


class _Stats:
    """Histogram entry of one important node over the window."""

    __slots__ = ("node", "count", "ctx_tokens", "hit_tokens", "prompt_tokens", "contrib")

    def __init__(self, node: _Node) -> None:
        self.node = node
        self.count = 0
        self.ctx_tokens = 0
        self.hit_tokens = 0
        self.prompt_tokens = 0
        self.contrib: dict[int, float] = {}
        """Load this node currently adds to each GPU (to subtract on change)."""


class _Node:
    __slots__ = ("keys", "start", "parent", "children", "gpus", "stats")

    def __init__(self, keys: list[int], start: int, parent: _Node | None) -> None:
        self.keys = keys
        self.start = start
        """Blocks on the path before this node's segment."""
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.gpus: set[int] = set()
        self.stats: _Stats | None = None

    @property
    def is_large(self) -> bool:
        return len(self.keys) > self.start


class Preble(Policy):
    name = "preble"

    def __init__(self, window_s: float = 180.0) -> None:
        self.window_s = window_s
        self.root = _Node([], 0, None)
        self.nodes = 0
        self.load: dict[int, float] = {}
        self._window: deque[tuple[float, _Stats, int, int]] = deque()
        self._model: PrefillModel | None = None
        self._block_size = 1

    # -- the global radix tree -------------------------------------------------

    def _split(self, node: _Node, j: int) -> _Node:
        """Cut ``node``'s segment after ``j`` blocks; return the new upper node."""
        assert node.parent is not None
        up = _Node(node.keys[:j], node.start, node.parent)
        up.gpus = set(node.gpus)
        node.parent.children[node.keys[0]] = up
        node.keys = node.keys[j:]
        node.start += j
        node.parent = up
        up.children[node.keys[0]] = node
        self.nodes += 1
        stats = node.stats
        if stats is not None and up.is_large and not node.is_large:
            # Preble renames the histogram entry to the parent, which is now
            # the important node of the requests counted under it.
            node.stats, up.stats, stats.node = None, stats, up
        self._refresh(node)
        self._refresh(up)
        return up

    def insert(self, keys: tuple[int, ...]) -> _Node:
        """Add a prompt's blocks; return the node that ends exactly at its last block."""
        node, i, n = self.root, 0, len(keys)
        while i < n:
            child = node.children.get(keys[i])
            if child is None:
                leaf = _Node(list(keys[i:]), i, node)
                node.children[keys[i]] = leaf
                self.nodes += 1
                return leaf
            seg = child.keys
            m = min(len(seg), n - i)
            j = 1
            while j < m and seg[j] == keys[i + j]:
                j += 1
            if j < len(seg):
                child = self._split(child, j)
            node, i = child, i + j
        return node

    @staticmethod
    def important(node: _Node) -> _Node:
        while not node.is_large and node.parent is not None:
            node = node.parent
        return node

    # -- windowed load ---------------------------------------------------------

    def _prefill_time(self, node: _Node) -> float:
        assert self._model is not None
        bs = self._block_size
        return self._model.predict(min(self._model.degrees), len(node.keys) * bs, node.start * bs)

    def _refresh(self, node: _Node) -> None:
        """Recompute the load ``node`` adds to its GPUs after its stats or allocation changed."""
        stats = node.stats
        if stats is None:
            return
        load = self.load
        for g, v in stats.contrib.items():
            load[g] -= v
        stats.contrib = {}
        if not node.gpus or stats.prompt_tokens <= 0:
            return
        miss = 1.0 - stats.hit_tokens / stats.prompt_tokens
        per_gpu = miss * stats.count * self._prefill_time(node) / len(node.gpus)
        for g in node.gpus:
            load[g] = load.get(g, 0.0) + per_gpu
            stats.contrib[g] = per_gpu

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        window = self._window
        while window and window[0][0] < horizon:
            _, stats, ctx, hit = window.popleft()
            stats.count -= 1
            stats.ctx_tokens -= ctx
            stats.hit_tokens -= hit
            stats.prompt_tokens -= ctx
            node = stats.node
            if stats.ctx_tokens <= 0:
                for g, v in stats.contrib.items():
                    self.load[g] -= v
                stats.contrib = {}
                node.stats = None
                node.gpus = set()
            else:
                self._refresh(node)

    # -- the policy ------------------------------------------------------------

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        cands = eligible(request, pool)
        if not cands:
            return None
        self._model = pool.model
        self._block_size = pool.block_size
        self._expire(request.arrival_s)
        leaf = self.insert(request.block_keys)
        ids = sorted(w.id for w in cands)
        load = self.load
        if len(leaf.keys) < leaf.start:
            # Exploit: the GPUs of the nearest allocated ancestor.
            node: _Node | None = leaf
            while node is not None and not node.gpus:
                node = node.parent
            allowed = set(ids)
            selected = {g for g in node.gpus if g in allowed} if node is not None else set()
            if not selected:
                selected = allowed
        else:
            # Explore: the least windowed load over every GPU.
            selected = {min(ids, key=lambda g: (load.get(g, 0.0), g))}
        pick = min(selected, key=lambda g: (load.get(g, 0.0), g))
        return decision_at(request, pick, pool, note=(leaf, selected))

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        worker = decision.worker
        if decision.note is None:
            # Placed without our decision (e.g. by another policy): record it alone.
            leaf, selected = self.insert(request.block_keys), {worker}
        else:
            leaf, selected = decision.note
        bs = pool.block_size
        ctx = (leaf.start + len(leaf.keys)) * bs
        hit = leaf.start * bs
        imp = self.important(leaf)
        if imp.stats is None:
            imp.stats = _Stats(imp)
        stats = imp.stats
        stats.count += 1
        stats.ctx_tokens += ctx
        stats.hit_tokens += hit
        stats.prompt_tokens += ctx
        self._window.append((request.arrival_s, stats, ctx, hit))
        node: _Node | None = leaf
        while node is not None and node is not self.root:
            if not selected <= node.gpus:
                node.gpus |= selected
                self._refresh(node)
            node = node.parent
        if imp.stats is stats:
            self._refresh(imp)
