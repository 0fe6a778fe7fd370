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
  (:class:`vertumnus.core.whatif.RequestTable`), and for each prefix a
  request reused, the requests that carry it, paired as they are placed;
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
from collections.abc import Iterable, Mapping

import numpy as np

from vertumnus.core import planner, whatif
from vertumnus.core.types import Request

__all__ = ["ControlWindows"]


class _SeenHop:
    """One hop's requests for the what-if check, column by column (arrays
    appended per placement, so that the check's table is array work), the key
    index (block key → positions of the hop's requests that carry it), and the
    carrier pairs found during the hop (see :meth:`ControlWindows.seen`)."""

    __slots__ = (
        "arrivals", "cached", "carrier_ids", "carrier_keys", "carrier_rows", "first", "keys",
        "lengths", "reused", "serial", "whole", "workers",
    )  # fmt: skip

    def __init__(self, serial: int, first: int) -> None:
        self.serial = serial
        """The hop's number, counted from the windows' creation."""
        self.first = first
        """The number of the hop's first request, counted over every hop."""
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
        self.reused = array("q")
        """The prefix id of each request's last cached block (-1: none)."""
        self.workers = array("q")
        """The worker each request was placed on (-1: not reported)."""
        self.carrier_ids = array("q")
        self.carrier_keys = array("Q")
        self.carrier_rows = array("q")
        """Pairs (prefix id and its key, number of a request carrying it) found in this hop."""

    def carriers(self, key: int) -> list[int]:
        """The numbers of the hop's requests that carry ``key``."""
        at = self.keys.get(key)
        if at is None:
            return []
        return [self.first + at] if isinstance(at, int) else [self.first + p for p in at]

    def pair(self, prefix: int, key: int, number: int) -> None:
        self.carrier_ids.append(prefix)
        self.carrier_keys.append(key)
        self.carrier_rows.append(number)

    def add(
        self,
        request: Request,
        cached_tokens: int,
        prefix: int,
        ids: Mapping[int, int],
        worker: int = -1,
    ) -> None:
        """``request`` seen; ``prefix``: the id of the prefix it reused (its last cached
        block; -1: none); ``ids``: the reused keys whose carriers are paired, and their
        ids (see :meth:`ControlWindows.seen`); ``worker``: where it was placed (-1: not
        reported)."""
        index = self.keys
        pos = len(self.arrivals)
        number = self.first + pos
        keys = request.block_keys
        for k in keys:
            found = index.get(k)
            if found is None:
                index[k] = pos
            elif isinstance(found, int):
                index[k] = [found, pos]
            else:
                found.append(pos)
        for k in ids.keys() & keys:
            self.pair(ids[k], k, number)
        self.arrivals.append(request.arrival_s)
        self.lengths.append(request.length)
        self.cached.append(cached_tokens)
        self.reused.append(prefix)
        self.workers.append(worker)


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
        self._seen = _SeenHop(0, 0)
        self._seen_hops: deque[_SeenHop] = deque(maxlen=settings.hops_per_window)
        """The last hops' requests (the open hop's in ``_seen``), for the what-if check."""
        self._ids: dict[int, int] = {}
        """Reused key → its prefix id, while a hop kept has a request reusing it: the
        keys whose carriers :meth:`seen` pairs."""
        self._id_keys = array("Q")
        """Prefix id → its key (the last one given the id: ids are given again)."""
        self._id_serials = array("q")
        """Prefix id → the serial of the newest hop with a request reusing its key."""
        self._free_ids: list[int] = []

    def placed(
        self, request: Request, estimate_s: float, cached_tokens: int = 0, worker: int = -1
    ) -> None:
        """A request's first placement: its Ê counts in the open hop (``cached_tokens``:
        the prefix it reuses there, and ``worker``: there, for the what-if check)."""
        self._demand += estimate_s
        self._requests += 1
        if request.length > self.settings.long_threshold:
            self._long += 1
            self._long_demand += estimate_s
        self.seen(request, cached_tokens, worker)

    def seen(self, request: Request, cached_tokens: int, worker: int = -1) -> None:
        """A request for the what-if check only (its demand counted by :meth:`add`).

        The check's table needs, for every prefix a request of the window
        reused, the requests of the window that carry it. They are paired here,
        at placement, so that the look pays array work instead of looking every
        reused key up in every hop's index: a request's blocks that are
        reused keys are paired with it, and a key reused for the first time
        (while kept) is looked up once in the window's hops."""
        hop = self._seen
        key = whatif.reused_key(request.block_keys, cached_tokens, self.block_size)
        prefix = -1
        if key is not None:
            prefix = self._ids.get(key, -1)
            if prefix < 0:
                prefix = self._new_id(key)
                for part in self._parts():
                    for number in part.carriers(key):
                        hop.pair(prefix, key, number)
            self._id_serials[prefix] = hop.serial
        hop.add(request, cached_tokens, prefix, self._ids, worker)

    def _new_id(self, key: int) -> int:
        """A prefix id for ``key`` (a free one, else the next)."""
        if self._free_ids:
            prefix = self._free_ids.pop()
            self._id_keys[prefix] = key
        else:
            prefix = len(self._id_keys)
            self._id_keys.append(key)
            self._id_serials.append(0)
        self._ids[key] = prefix
        return prefix

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

    @property
    def open_hop_requests(self) -> int:
        """The requests seen in the open hop (``sum(hop_counts()[-1])``, without
        counting every hop's long ones)."""
        return len(self._seen.lengths)

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

        def cat(name: str, dtype: type) -> np.ndarray:
            return np.concatenate([np.frombuffer(getattr(p, name), dtype=dtype) for p in parts])

        # Pairs made in the window's hops may name requests of the hops before it,
        # and ids given again since to another key.
        rows = cat("carrier_rows", np.int64) - parts[0].first
        ids = cat("carrier_ids", np.int64)
        id_keys = np.frombuffer(self._id_keys, dtype=np.uint64)
        valid = (rows >= 0) & (id_keys[ids] == cat("carrier_keys", np.uint64))
        return whatif.Columns(
            arrivals=cat("arrivals", np.float64),
            lengths=cat("lengths", np.int64),
            cached=cat("cached", np.int64),
            reused=cat("reused", np.int64),
            n_prefixes=len(id_keys),
            carrier_ids=ids[valid],
            carrier_rows=rows[valid],
            workers=cat("workers", np.int64),
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
        done = self._seen
        if len(self._seen_hops) == self._seen_hops.maxlen:
            # The oldest hop goes: its reused keys are no longer wanted unless a
            # newer hop reused them too. Its ids are still its keys' (an id is
            # given again only after the newest hop reusing its key has gone).
            gone = self._seen_hops[0]
            for prefix in set(gone.reused) - {-1}:
                if self._id_serials[prefix] == gone.serial:
                    del self._ids[self._id_keys[prefix]]
                    self._free_ids.append(prefix)
        self._seen_hops.append(done)
        self._seen = _SeenHop(done.serial + 1, done.first + len(done.arrivals))
        decay = 0.5 ** (self.settings.hop / self.settings.window_s)
        for w in self._reuse:
            self._reuse[w] *= decay
