"""The policy interface and the view of the pool a policy decides over."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import WorkerState, candidates
from vertumnus.core.types import Request


class PoolView(Protocol):
    """What a policy may look at. Implemented by the simulator and the router."""

    @property
    def workers(self) -> Sequence[WorkerState]: ...

    @property
    def model(self) -> PrefillModel: ...

    @property
    def block_size(self) -> int: ...

    def matched_blocks(self, request: Request) -> Mapping[int, int]:
        """Exact leading blocks of ``request`` cached per worker (from cache events)."""
        ...


@dataclass(frozen=True, slots=True)
class Decision:
    worker: int
    preferred_degree: int = 0
    """C_pref(i) when the policy computes one (0 = none); feeds the cache manager."""
    estimate_s: float | None = None
    """Ê the policy predicted at the chosen worker, to reserve there; None lets
    the shell predict it from the exact cached prefix."""


class Policy:
    """Base class: subclasses set ``name`` and implement :meth:`decide`."""

    name = "policy"

    def decide(self, request: Request, pool: PoolView) -> Decision | None:
        """The worker for ``request``, or None when no worker can take it now."""
        raise NotImplementedError

    def observe_placed(self, request: Request, worker: int, pool: PoolView) -> None:
        """Called after ``request`` was queued at ``worker``."""

    def observe_completed(self, request: Request, worker: int) -> None:
        """Called when ``request`` finished its prefill at ``worker``."""


def least_loaded(workers: Sequence[WorkerState]) -> WorkerState:
    """Least outstanding predicted work; ties to the lowest id."""
    return min(workers, key=lambda w: (w.outstanding_s, w.id))


def eligible(request: Request, pool: PoolView) -> list[WorkerState]:
    return candidates(pool.workers, request.length, pool.model)
