"""The composition controller's bookkeeping: observation windows, reuse weights, history (design.md section 4).

The planner (:mod:`vertumnus.core.planner`) decides from one
:class:`~vertumnus.core.planner.WindowObservation` at a time; this module
builds those observations from what the pool does, the same way in every
shell, and runs the planner's steps:

- **windows**: every placement of a request adds its Ê (at the worker it was
  placed on) to the open hop, once per request (a request placed again after
  a drain is not counted twice); a window is the last ``window_s`` seconds,
  i.e. the last ``window_s / hop_s`` hops (one hop for disjoint windows), and
  the newest hop is the observation's ``fresh_*`` part;
- **reuse weights**: the cached blocks each worker reused recently, halving
  per window, so that the planner ranks a reconfiguration of a worker whose
  cache is in demand after one whose cache is cold;
- **history**: the planner's view of a past workload
  (:func:`history_requests`), for the initial composition.

:class:`Controller` ties the planner state, the windows and the capacity
profile together: the shell calls :meth:`Controller.tick` every
``settings.hop`` seconds of its own time and :meth:`Controller.committed`
after each commit, and starts the operations they return (through
:mod:`vertumnus.core.transition`). Pure: no clock (the shell measures the
planner's time if it wants to), no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vertumnus.core import planner
from vertumnus.core.types import Request, cached_tokens

__all__ = ["Controller", "ControlWindows", "Tick", "history_requests"]


@dataclass(frozen=True)
class Tick:
    """One evaluation of the controller: what it saw and what it decided."""

    observation: planner.WindowObservation
    utilization: float
    ops: tuple[planner.Op, ...]
    target: str | None
    """Where the transition in progress is heading (multi-step), if anywhere."""


class ControlWindows:
    """Per-hop demand buckets and per-worker reuse weights (see the module docstring)."""

    def __init__(self, settings: planner.PlannerSettings) -> None:
        self.settings = settings
        self._demand = 0.0
        self._requests = 0
        self._long = 0
        self._long_demand = 0.0
        self._buckets: deque[tuple[float, int, int, float]] = deque(maxlen=settings.hops_per_window)
        """The last H/h hops' (demand, requests, long requests, long demand), newest last."""
        self._reuse: dict[int, float] = {}

    def placed(self, request: Request, estimate_s: float) -> None:
        """A request's first placement: its Ê counts in the open hop."""
        self._demand += estimate_s
        self._requests += 1
        if request.length > self.settings.long_threshold:
            self._long += 1
            self._long_demand += estimate_s

    def add(self, demand_s: float, requests: int, long_requests: int, long_demand_s: float) -> None:
        """Demand counted elsewhere (a router replica's report for the open hop)."""
        self._demand += demand_s
        self._requests += requests
        self._long += long_requests
        self._long_demand += long_demand_s

    def reused(self, worker: int, blocks: float) -> None:
        """``worker`` served ``blocks`` cached blocks to a request."""
        self._reuse[worker] = self._reuse.get(worker, 0.0) + blocks

    def reuse_weight(self, worker: int) -> float:
        return self._reuse.get(worker, 0.0)

    def forget(self, workers: Iterable[int]) -> None:
        """Workers left the pool."""
        for w in workers:
            self._reuse.pop(w, None)

    @property
    def ready(self) -> bool:
        """A whole window has been seen (the first ``hops_per_window − 1`` hops only fill it)."""
        return len(self._buckets) >= self.settings.hops_per_window - 1

    def observation(
        self, workers: tuple[planner.WorkerObservation, ...], reconfiguring: bool
    ) -> planner.WindowObservation:
        """The window ending now: the closed buckets plus the open hop."""
        hops = self.settings.hops_per_window
        if hops == 1:
            return planner.WindowObservation(
                demand_s=self._demand,
                requests=self._requests,
                long_requests=self._long,
                long_demand_s=self._long_demand,
                workers=workers,
                reconfiguring=reconfiguring,
            )
        newest = (self._demand, self._requests, self._long, self._long_demand)
        parts = [*list(self._buckets)[-(hops - 1) :], newest]
        return planner.WindowObservation(
            demand_s=math.fsum(b[0] for b in parts),
            requests=sum(b[1] for b in parts),
            long_requests=sum(b[2] for b in parts),
            long_demand_s=math.fsum(b[3] for b in parts),
            workers=workers,
            reconfiguring=reconfiguring,
            fresh_demand_s=newest[0],
            fresh_long_requests=newest[2],
            fresh_long_demand_s=newest[3],
        )

    def close_hop(self) -> None:
        """The open hop ends: it becomes the newest bucket; reuse weights decay
        (halving per window)."""
        self._buckets.append((self._demand, self._requests, self._long, self._long_demand))
        self._demand, self._requests, self._long, self._long_demand = 0.0, 0, 0, 0.0
        decay = 0.5 ** (self.settings.hop / self.settings.window_s)
        for w in self._reuse:
            self._reuse[w] *= decay


class Controller:
    """The planner's state and its windows, stepped by a shell."""

    def __init__(
        self,
        state: planner.ControllerState,
        capacity: planner.CapacityProfile,
        settings: planner.PlannerSettings,
    ) -> None:
        self.state = state
        self.capacity = capacity
        self.settings = settings
        self.windows = ControlWindows(settings)

    def workers(
        self, running_remaining_s: Mapping[int, float]
    ) -> tuple[planner.WorkerObservation, ...]:
        """Observations of the workers ``running_remaining_s`` names (id → seconds left
        of its running prefill), with their reuse weights."""
        return tuple(
            planner.WorkerObservation(w, rest, self.windows.reuse_weight(w))
            for w, rest in running_remaining_s.items()
        )

    def tick(self, running_remaining_s: Mapping[int, float], reconfiguring: bool) -> Tick | None:
        """One hop ended: evaluate the window (once a whole one has been seen), close the
        hop, and return what was decided (None while the first window fills)."""
        if not self.windows.ready:
            self.windows.close_hop()
            return None
        obs = self.windows.observation(self.workers(running_remaining_s), reconfiguring)
        self.state, ops = planner.step(self.state, obs, self.capacity, self.settings)
        k_cap = self.capacity.capacity_per_s(s.degree for s in self.state.layout.slots)
        tick = Tick(
            obs,
            obs.demand_s / (self.settings.window_s * k_cap),
            ops,
            None if self.state.target is None else str(self.state.target),
        )
        self.windows.close_hop()
        return tick

    def committed(
        self,
        op: planner.Op,
        new_ids: Sequence[int],
        removed: Sequence[int],
        running_remaining_s: Mapping[int, float],
    ) -> tuple[planner.Op, ...]:
        """``op`` committed, creating ``new_ids`` in place of ``removed``: the next
        operations of the transition in progress (empty: none now)."""
        self.state = planner.commit(self.state, new_ids, op)
        self.windows.forget(removed)
        self.state, more = planner.advance(
            self.state, self.workers(running_remaining_s), self.capacity, self.settings
        )
        return more


def history_requests(
    requests: Iterable[Request], block_size: int, history_s: float | None = None
) -> list[planner.HistoryRequest]:
    """The planner's view of the first ``history_s`` seconds of ``requests`` (all if None).

    Cached tokens are estimated as an ideal global cache would see them
    (blocks seen earlier in the history), i.e. the reuse placement can at
    best achieve.
    """
    out: list[planner.HistoryRequest] = []
    seen: set[int] = set()
    t_end = math.inf
    for r in requests:
        if not out and history_s is not None:
            t_end = r.arrival_s + history_s
        if r.arrival_s >= t_end:
            break
        n = 0
        for k in r.block_keys:
            if k not in seen:
                break
            n += 1
        seen.update(r.block_keys)
        out.append(
            planner.HistoryRequest(r.arrival_s, r.length, cached_tokens(n, r.length, block_size))
        )
    return out
