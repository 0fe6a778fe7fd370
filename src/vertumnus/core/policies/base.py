"""The policy interface and the view of the pool a policy decides over.

A policy is asked ``decide(request, pool)`` and answers with a
:class:`~vertumnus.core.decision.RouteDecision` (or None: no worker can take
the request now). The routing core (:mod:`vertumnus.core.routing`) then
reserves the decision's Ê, and hands the same decision back to the policy's
``observe_placed``; ``observe_completed`` follows once the request finished
or left its worker. The simulator and the router drive policies only through
the routing core, so both see exactly the same calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.placement import WorkerState, candidates
from vertumnus.core.store import TrieStore
from vertumnus.core.types import Request, cached_tokens


class PoolView(Protocol):
    """What a policy may look at. Implemented by the routing core for the simulator and the router."""

    @property
    def workers(self) -> Sequence[WorkerState]: ...

    @property
    def model(self) -> PrefillModel: ...

    @property
    def block_size(self) -> int: ...

    @property
    def store(self) -> TrieStore:
        """The global prefix index (cache events of every worker)."""
        ...

    def worker(self, worker_id: int) -> WorkerState: ...

    def matched_blocks(self, request: Request) -> Mapping[int, int]:
        """Exact leading blocks of ``request`` cached per worker (from cache events)."""
        ...

    def inflight_blocks(self, request: Request) -> Mapping[int, int]:
        """Per worker, leading blocks of ``request`` that requests placed there and not
        yet finished will have cached by the time it runs (:mod:`vertumnus.core.inflight`)."""
        ...


class Policy:
    """Base class: subclasses set ``name`` and implement :meth:`decide`."""

    name = "policy"

    def decide(self, request: Request, pool: PoolView) -> RouteDecision | None:
        """Where ``request`` goes, or None when no worker can take it now."""
        raise NotImplementedError

    def observe_placed(self, request: Request, decision: RouteDecision, pool: PoolView) -> None:
        """Called after ``request`` was placed as ``decision`` says (its Ê reserved)."""

    def observe_completed(self, request: Request, worker: int) -> None:
        """Called when ``request`` finished its prefill at ``worker``, or left it
        (failed, or withdrawn by a drain to be placed again)."""


def decision_at(
    request: Request,
    worker_id: int,
    pool: PoolView,
    *,
    preferred_degree: int = 0,
    note: Any = None,
) -> RouteDecision:
    """The decision to place ``request`` at ``worker_id``, with Ê from the exact cached prefix.

    For policies that pick a worker by a rule of their own (the baselines, the
    peers): the shell reserves what the cost model predicts for the prefix the
    worker really holds, whatever the policy believed about it.
    """
    worker = pool.worker(worker_id)
    matched = pool.matched_blocks(request).get(worker_id, 0)
    p = cached_tokens(matched, request.length, pool.block_size)
    estimate = pool.model.predict(worker.degree, request.length - p, p)
    return RouteDecision(worker_id, estimate, p, preferred_degree, None, worker.outstanding_s, note)


def least_loaded(workers: Sequence[WorkerState]) -> WorkerState:
    """Least outstanding predicted work; ties to the lowest id."""
    return min(workers, key=lambda w: (w.outstanding_s, w.id))


def eligible(request: Request, pool: PoolView) -> list[WorkerState]:
    return candidates(pool.workers, request.length, pool.model)
