"""The one placement decision type, handed to everyone who acts on a placement.

A policy returns a :class:`RouteDecision` from ``decide``; the routing core
(:mod:`vertumnus.core.routing`) reserves its Ê at the worker, gives it back
to the policy (``observe_placed``), to the cache manager (which learns from
the preferred degree and the reused prefix) and to the shell (the simulator
queues the request, the router forwards it). Nobody recomputes what the
decision already says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from vertumnus.core.reconcile import PendingCopy


class RouteDecision(NamedTuple):
    """Where one request goes, and what the policy predicted there.

    A named tuple rather than a dataclass: one is built per placement on the
    router's hot path, and a tuple is built several times faster.
    """

    worker: int
    estimate_s: float
    """Ê at the chosen worker, E_C(R, P): the work reserved there (q_w grows by it)."""
    cached_tokens: int
    """P: the prefix tokens the decision counted on at the worker (cached now,
    or left by requests queued before it there)."""
    preferred_degree: int = 0
    """C_pref(i): the degree of the worker the cost model would pick with no
    queue anywhere (0: the policy computes none). Feeds the cache manager."""
    cost: float | None = None
    """The winning placement cost q_w + β·Ê + λ·(C_w/C_min − 1)·Ê (None for a
    policy that does not minimise one)."""
    queue_s: float = 0.0
    """q_w at the chosen worker when the decision was taken: its predicted wait."""
    note: Any = None
    """The deciding policy's own data, handed back to its ``observe_placed``
    (e.g. the tree node it matched); opaque to everyone else."""
    copies: tuple[PendingCopy, ...] = ()
    """Pending blocks of a recent split or merge that this placement reuses:
    the shell copies them to the worker before the prefill (set by the
    routing core, :mod:`vertumnus.core.reconcile`)."""
