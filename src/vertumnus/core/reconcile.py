"""KV reconciliation after a split or a merge: which prefixes go where, which blocks are pending (design.md section 5).

A split or merge changes a worker's geometry but moves no KV: the cached
blocks stay on the ranks that hold them, and only the prefix metadata moves.
This module says how (pure functions over explicit inputs; the shells
supply each worker's retained prefixes and carry the plan out):

- **merge** of buddies A and B into M: M's prefixes are the union of A's and
  B's, interleaved by recency. A block both held is complete on M's ranks;
  a block only one of them held is **pending** on M's own ranks (half of M's
  ranks have its KV: the other half must be filled in from them). A block
  that was already pending stays pending, with its source moved to M if that
  source was A or B;
- **split** of P into children X and Y: P's retained prefixes are dealt to
  the children, most recently used first, each to the child with the least
  demand assigned so far that still has room for it (a prefix's demand
  weight falls with its recency rank: 1/(1 + rank)); every block a child
  gets is **pending** there, with its sibling's ranks as the source of the
  missing half.

A pending block is copied — missing blocks only — by the first placement
that reuses it (:class:`PendingCopy`, emitted by the routing core), and
becomes a miss if no valid copy remains (its source left the pool first:
the routing core invalidates it, :class:`~vertumnus.core.routing.Invalidation`).
The simulator and the router run exactly this plan and these copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PendingCopy", "ReconcilePlan", "plan_merge", "plan_split"]

Prefix = tuple[int, ...]
"""A root→leaf chain of block keys, root first."""


@dataclass(frozen=True, slots=True)
class PendingCopy:
    """Copy the pending ``blocks`` of the prefix ``keys`` to ``worker`` from ``source``
    (``source == worker``: from its own ranks) before the request that reuses them runs."""

    worker: int
    source: int
    keys: tuple[int, ...]
    """The reused prefix, root first (the worker copies what it lacks of it)."""
    blocks: tuple[int, ...]
    """The pending blocks among ``keys``, in prefix order."""


@dataclass(frozen=True)
class ReconcilePlan:
    """What each new worker retains, and which of its blocks are pending."""

    prefixes: Mapping[int, tuple[Prefix, ...]]
    """New worker → its prefixes, least recently used first (the order to insert
    them into an LRU cache so that recency survives)."""
    pending: Mapping[int, Mapping[int, int]]
    """New worker → block key → the worker whose ranks hold the missing KV."""


def plan_split(
    prefixes: Sequence[Prefix], children: tuple[int, int], capacity_blocks: int
) -> ReconcilePlan:
    """Deal the parent's ``prefixes`` (least recently used first) to ``children``,
    each child holding at most ``capacity_blocks`` blocks."""
    assigned: tuple[list[Prefix], list[Prefix]] = ([], [])
    blocks: tuple[set[int], set[int]] = (set(), set())
    demand = [0.0, 0.0]
    for rank, path in enumerate(reversed(prefixes)):  # most recent first
        for c in sorted((0, 1), key=lambda c: (demand[c], c)):
            new = sum(1 for k in path if k not in blocks[c])
            if len(blocks[c]) + new <= capacity_blocks:
                assigned[c].append(path)
                blocks[c].update(path)
                demand[c] += 1.0 / (1 + rank)
                break
    out_prefixes: dict[int, tuple[Prefix, ...]] = {}
    pending: dict[int, dict[int, int]] = {}
    for c in (0, 1):
        child, sibling = children[c], children[1 - c]
        out_prefixes[child] = tuple(reversed(assigned[c]))  # least recent first
        # Every block's other half lives on the sibling's ranks.
        pending[child] = {k: sibling for p in out_prefixes[child] for k in p}
    return ReconcilePlan(out_prefixes, pending)


def plan_merge(
    a: Sequence[Prefix],
    b: Sequence[Prefix],
    sources: tuple[int, int],
    merged: int,
    pending_a: Mapping[int, int] | None = None,
    pending_b: Mapping[int, int] | None = None,
) -> ReconcilePlan:
    """Combine the prefixes of buddies ``sources`` = (A, B) (``a``, ``b``: least
    recently used first) into ``merged``; ``pending_a/b`` are what was still
    pending at A and B (key → source)."""
    # Interleave the two recency orders so neither source's prefixes are all
    # older than the other's in the merged LRU.
    order: list[Prefix] = []
    for i in range(max(len(a), len(b))):
        if i < len(a):
            order.append(a[i])
        if i < len(b):
            order.append(b[i])
    in_a = {k for p in a for k in p}
    in_b = {k for p in b for k in p}
    prior = {**(pending_a or {}), **(pending_b or {})}
    pending: dict[int, int] = {}
    for k in _keys_in_order(order):
        was = prior.get(k)
        if was is not None:
            # Still incomplete; if the missing half was on the buddy it is now our own.
            pending[k] = merged if was in sources else was
        elif not (k in in_a and k in in_b):
            # Held by one source only: its KV sits on half of the merged ranks.
            pending[k] = merged
    return ReconcilePlan({merged: tuple(order)}, {merged: pending})


def _keys_in_order(prefixes: Sequence[Prefix]) -> list[int]:
    """Every key of ``prefixes`` once, first occurrence order."""
    seen: dict[int, None] = {}
    for p in prefixes:
        for k in p:
            seen.setdefault(k)
    return list(seen)
