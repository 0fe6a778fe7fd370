"""Shadow pools: each candidate composition serves the pool's requests alongside it, continuously (issue 12).

The what-if check (:mod:`vertumnus.core.whatif`) replays one window at a time,
cold: no worker holds a prefix cached before the window, and a request can
reuse at most what it reused on the current composition. On a conversation
workload that hides most of the reuse and overstates what a split costs by
more than the compositions differ (docs/benchmarks/adaptive.md, "The
estimate's bias on mooncake, again"). A :class:`Shadow` has neither limit: it
is one composition's pool that serves every request the real pool serves, as
it arrives, with the same cost-model placement, per-worker LRU prefix caches
of the real capacity, and its own queues, kept from request to request and
window to window. Its TTFTs are what that composition would have given, as
far as the cost model goes; two shadows fed the same requests compare on the
same requests.

A :class:`ShadowBank` keeps one shadow per composition it is told to follow
(the current one and its neighbours), and :meth:`ShadowBank.compare` pools
each one's TTFTs over a horizon (the mean and the P90 of the pooled requests,
as the pool is judged, not an average of each window's): a composition better
there by a margin, over minutes of requests, is better on the stretch the pool
serves, not on one window's noise.

Cost: each request is placed once per shadow (the cost at every worker, a
prefix match each), as it comes, rather than each window replayed at every
look. Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vertumnus.core.blockcache import BlockCache
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition, Request, cached_tokens
from vertumnus.core.whatif import WaitingWorkers

__all__ = ["Comparison", "Shadow", "ShadowBank"]


class Shadow:
    """One composition's pool, serving requests as they arrive (module docstring)."""

    __slots__ = (
        "arrivals", "block_size", "caches", "composition", "degrees", "free", "lam", "model",
        "params", "started_s", "ttfts", "_max_tokens", "_waiting",
    )  # fmt: skip

    def __init__(
        self,
        composition: Composition,
        model: PrefillModel,
        params: PlacementParams,
        cache_blocks_per_gpu: int,
        block_size: int,
        started_s: float,
    ) -> None:
        self.composition = composition
        self.model = model
        self.params = params
        self.block_size = block_size
        self.degrees = sorted(composition.degrees)
        smallest = self.degrees[0]
        self.lam = [params.lam * (d / smallest - 1.0) for d in self.degrees]
        self._max_tokens = [model.max_tokens(d) for d in self.degrees]
        self.free = [started_s] * len(self.degrees)
        self.caches = [BlockCache(cache_blocks_per_gpu * d) for d in self.degrees]
        self._waiting = WaitingWorkers(len(self.degrees))
        self.started_s = started_s
        """When it started serving, cold: its first minutes are not yet the composition's."""
        self.arrivals: list[float] = []
        self.ttfts: list[float] = []
        """Per request served, in arrival order: its arrival and its TTFT (no T_ext)."""

    def serve(self, request: Request) -> None:
        """Place ``request`` as the pool's cost model would, and record its TTFT."""
        a = request.arrival_s
        keys = request.block_keys
        p = self.params
        beta = self._waiting.beta(a, p.beta, p.beta_busy - p.beta)
        best: tuple[float, float, int] | None = None
        found = (0.0, 0.0, 0)
        for w, d in enumerate(self.degrees):
            if request.length > self._max_tokens[w]:
                continue
            m = self.caches[w].match(keys)
            reused = cached_tokens(m, request.length, self.block_size)
            e = self.model.predict(d, request.length - reused, reused)
            f = self.free[w]
            start = f if f > a else a
            # Ties go to the longest-idle worker, as placement breaks them.
            key = ((start - a) + (beta + self.lam[w]) * e, f, w)
            if best is None or key < best:
                best, found = key, (start, e, m)
        if best is None:
            return  # no worker of this composition can hold it: it is refused, not served
        w = best[2]
        start, e, m = found
        self.free[w] = start + e
        self._waiting.placed(w, start, a)
        cache = self.caches[w]
        if m:
            cache.touch(keys, m)
        cache.insert(keys)
        self.arrivals.append(a)
        self.ttfts.append(start + e - a)

    def forget_before(self, t: float) -> None:
        """Drop the records of requests that arrived before ``t``."""
        i = bisect.bisect_left(self.arrivals, t)
        if i:
            del self.arrivals[:i]
            del self.ttfts[:i]


@dataclass(frozen=True)
class Comparison:
    """A candidate's pooled TTFTs against the current composition's, on the same requests."""

    composition: Composition
    requests: int
    span_s: float
    mean_gain: float
    """1 − candidate's mean TTFT / the current one's (positive: the candidate is faster)."""
    p90_gain: float

    def weighed(self, p90_weight: float) -> float:
        """The gain with the P90's weighed by ``p90_weight``, the mean's by the rest."""
        return (1.0 - p90_weight) * self.mean_gain + p90_weight * self.p90_gain

    def to_dict(self) -> dict[str, object]:
        return {
            "composition": str(self.composition),
            "requests": self.requests,
            "span_s": round(self.span_s, 1),
            "mean_gain": round(self.mean_gain, 5),
            "p90_gain": round(self.p90_gain, 5),
        }


class ShadowBank:
    """The shadows of the compositions the controller follows (module docstring)."""

    def __init__(
        self,
        model: PrefillModel,
        params: PlacementParams,
        cache_blocks_per_gpu: int,
        block_size: int,
        horizon_s: float,
        warmup_s: float,
    ) -> None:
        self.model = model
        self.params = params
        self.cache_blocks_per_gpu = cache_blocks_per_gpu
        self.block_size = block_size
        self.horizon_s = horizon_s
        self.warmup_s = warmup_s
        """A new shadow's first seconds are left out of every comparison: it started cold."""
        self.shadows: dict[Composition, Shadow] = {}
        self.now_s = 0.0
        """The latest arrival served."""

    def follow(self, compositions: Iterable[Composition]) -> None:
        """Keep a shadow for each of ``compositions`` (new ones start cold, now) and
        drop the others."""
        wanted = set(compositions)
        for c in list(self.shadows):
            if c not in wanted:
                del self.shadows[c]
        for c in wanted - set(self.shadows):
            self.shadows[c] = Shadow(
                c, self.model, self.params, self.cache_blocks_per_gpu, self.block_size, self.now_s
            )

    def serve(self, request: Request) -> None:
        """Every shadow serves ``request`` (the pool's requests, in arrival order)."""
        self.now_s = max(self.now_s, request.arrival_s)
        for s in self.shadows.values():
            s.serve(request)

    def compare(self, current: Composition, since_s: float = -np.inf) -> list[Comparison]:
        """Every other shadow against ``current``'s, pooled over the requests both
        served in the last ``horizon_s`` and since ``since_s``, after both warmed
        up (empty without a shadow of ``current``)."""
        base = self.shadows.get(current)
        if base is None:
            return []
        lo_all = self.now_s - self.horizon_s
        for s in self.shadows.values():
            s.forget_before(lo_all)
        out = []
        for comp, s in self.shadows.items():
            if comp == current:
                continue
            lo = max(lo_all, since_s, base.started_s + self.warmup_s, s.started_s + self.warmup_s)
            i = bisect.bisect_left(base.arrivals, lo)
            j = bisect.bisect_left(s.arrivals, lo)
            mine, theirs = np.asarray(base.ttfts[i:]), np.asarray(s.ttfts[j:])
            if len(mine) != len(theirs) or len(mine) == 0:
                continue  # a request one of them refused: not the same requests
            out.append(
                Comparison(
                    comp,
                    len(mine),
                    self.now_s - lo,
                    1.0 - float(theirs.mean()) / float(mine.mean()),
                    1.0 - float(np.percentile(theirs, 90)) / float(np.percentile(mine, 90)),
                )
            )
        return out
