"""The composition controller's observation windows (design.md section 4).

What the shell reports about the pool's traffic, kept per hop so that a
window is the sum of its last hops (:class:`ControlWindows`):

- **demand**: every placement of a request adds its Ê (at the worker it was
  placed on) to the open hop, once per request (a request placed again after
  a drain is not counted twice); a window is the last ``window_s`` seconds,
  i.e. the last ``window_s / hop_s`` hops (one hop for disjoint windows), and
  the newest hop is the observation's ``fresh_*`` part;
- **the requests themselves**, column by column with an index of their
  blocks, for the what-if check's request table
  (:class:`vertumnus.core.whatif.RequestTable`);
- **reuse weights**: the cached blocks each worker reused recently, halving
  per window, so that the planner ranks a reconfiguration of a worker whose
  cache is in demand after one whose cache is cold.

:class:`vertumnus.core.control.Controller` owns one and reads it at every
look. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterable

import numpy as np

from vertumnus.core import planner, whatif
from vertumnus.core.types import Request

__all__ = ["ControlWindows"]


class _SeenHop:
    """One hop's requests for the what-if check, column by column (arrays
    appended per placement, so that the check's table is array work), and the key
    index (block key → positions of the hop's requests that carry it), so that the
    check looks up the reused prefixes instead of scanning every block of the window."""

    __slots__ = ("arrivals", "cached", "keys", "lengths", "reused_keys", "reuses", "whole")

    def __init__(self) -> None:
        self.whole = True
        """False: some of the hop's requests are missing (a report was cut)."""
        self.keys: dict[int, int | list[int]] = {}
        """Block key → the position of the hop's request that carries it, or a list of
        positions when several do. Most keys have one carrier; an int is not tracked by
        the cyclic garbage collector, a list is, and at 1,024 GPUs a window's index
        holds ~400,000 keys for a full collection to walk."""
        self.arrivals = array("d")
        self.lengths = array("q")
        self.cached = array("q")
        self.reused_keys = array("Q")
        self.reuses = array("b")

    def add(self, request: Request, cached_tokens: int, block_size: int) -> None:
        keys = request.block_keys
        index = self.keys
        pos = len(self.arrivals)
        for k in keys:
            found = index.get(k)
            if found is None:
                index[k] = pos
            elif isinstance(found, int):
                index[k] = [found, pos]
            else:
                found.append(pos)
        self.arrivals.append(request.arrival_s)
        self.lengths.append(request.length)
        self.cached.append(cached_tokens)
        reused = whatif.reused_key(keys, cached_tokens, block_size)
        self.reused_keys.append(0 if reused is None else reused)
        self.reuses.append(reused is not None)


class ControlWindows:
    """Per-hop demand buckets and per-worker reuse weights (see the module docstring)."""

    def __init__(self, settings: planner.PlannerSettings, block_size: int = 512) -> None:
        self.settings = settings
        self._demand = 0.0
        self._requests = 0
        self._long = 0
        self._long_demand = 0.0
        self._buckets: deque[tuple[float, int, int, float]] = deque(maxlen=settings.hops_per_window)
        """The last H/h hops' (demand, requests, long requests, long demand), newest last."""
        self._reuse: dict[int, float] = {}
        self.block_size = block_size
        self._seen = _SeenHop()
        self._seen_hops: deque[_SeenHop] = deque(maxlen=settings.hops_per_window)
        """The open hop's and the last hops' requests, for the what-if check."""

    def placed(self, request: Request, estimate_s: float, cached_tokens: int = 0) -> None:
        """A request's first placement: its Ê counts in the open hop (``cached_tokens``:
        the prefix it reuses there, for the what-if check)."""
        self._demand += estimate_s
        self._requests += 1
        if request.length > self.settings.long_threshold:
            self._long += 1
            self._long_demand += estimate_s
        self.seen(request, cached_tokens)

    def seen(self, request: Request, cached_tokens: int) -> None:
        """A request for the what-if check only (its demand counted by :meth:`add`)."""
        self._seen.add(request, cached_tokens, self.block_size)

    def _parts(self) -> list[_SeenHop]:
        """The window's hops, oldest first."""
        hops = self.settings.hops_per_window
        parts = list(self._seen_hops)[-(hops - 1) :] if hops > 1 else []
        parts.append(self._seen)
        return parts

    def hop_counts(self) -> list[tuple[int, int]]:
        """Per hop of the window, oldest first: the short and the long requests seen."""
        at = self.settings.long_threshold
        out = []
        for p in self._parts():
            long = int(np.count_nonzero(np.frombuffer(p.lengths, dtype=np.int64) > at))
            out.append((len(p.lengths) - long, long))
        return out

    def cut(self) -> None:
        """Some of the open hop's requests will not be seen (a router replica listed
        only so many): the what-if check skips every window that holds this hop, since
        replaying part of a window's requests would underestimate its load."""
        self._seen.whole = False

    @property
    def whole(self) -> bool:
        """Every request of the window was seen (no hop of it was :meth:`cut`)."""
        return all(p.whole for p in self._parts())

    def columns(self) -> whatif.Columns:
        """The window's requests column by column, for :meth:`RequestTable.of_columns
        <vertumnus.core.whatif.RequestTable.of_columns>`."""
        parts = self._parts()
        offsets = np.cumsum([0] + [len(p.arrivals) for p in parts[:-1]]).tolist()

        def cat(name: str, dtype: type) -> np.ndarray:
            return np.concatenate([np.frombuffer(getattr(p, name), dtype=dtype) for p in parts])

        return whatif.Columns(
            arrivals=cat("arrivals", np.float64),
            lengths=cat("lengths", np.int64),
            cached=cat("cached", np.int64),
            reused_keys=cat("reused_keys", np.uint64),
            reuses=cat("reuses", np.int8).astype(bool),
            key_index=[(o, p.keys) for o, p in zip(offsets, parts, strict=True)],
        )

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
        self._seen_hops.append(self._seen)
        self._seen = _SeenHop()
        decay = 0.5 ** (self.settings.hop / self.settings.window_s)
        for w in self._reuse:
            self._reuse[w] *= decay
