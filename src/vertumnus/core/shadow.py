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

Cost: each request is placed once per shadow, as it comes, rather than each
window replayed at every look; a placement costs a few candidate workers, not
every worker (:class:`Shadow`), in a compiled twin (``_shadow.c``, the same
placements to the bit) where the build has one, and a comparison a selection
over the horizon's TTFTs. Memory: each shadow caches as many tokens as the pool;
a large pool's shadows count reuse in coarser blocks to stay within
``PlannerSettings.shadow_memory_mib`` (:func:`block_tokens`).
``bench/shadow_speed.py`` measures all three; the controller keeps no shadows
for a pool over ``PlannerSettings.shadow_max_gpus``. Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from vertumnus.core import whatif
from vertumnus.core.blockcache import BlockCache
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition, Request, cached_tokens
from vertumnus.core.whatif import WaitingWorkers

__all__ = ["HOT_PATH", "SHADOW_BLOCK_TOKENS", "Comparison", "Shadow", "ShadowBank", "monotone"]

# The shadows' placement: the compiled twin of Shadow's search (_shadow.c, the same
# placements) where the build produced it, else the Python one. HOT_PATH names it.
HOT_PATH: str
_Core: type[_shadow.Core] | None
try:
    from vertumnus.core import _shadow
except ImportError:  # built without a C compiler
    _Core, HOT_PATH = None, "python"
else:
    _Core, HOT_PATH = _shadow.Core, "c"


class Shadow:
    """One composition's pool, serving requests as they arrive (module docstring).

    Placement looks at few workers, and picks the one a scan of all of them
    would (the test holds it to the scan, request by request): of each
    degree's workers that hold none of the request's prefix only the one free
    soonest can win (a lazy heap per degree), and the holders are walked from
    the longest prefix held to the shortest, through an index of who holds
    each block, stopping once no worker holding less can beat the best found.
    That needs a prefill time that falls as more of the prompt is cached, as a
    fitted profile's does (:func:`monotone`); a composition whose profile is
    not is scanned whole.
    """

    __slots__ = (
        "arrivals", "block_size", "caches", "composition", "degrees", "free", "lam", "model",
        "params", "scan", "started_s", "ttfts", "_core", "_group", "_groups", "_heaps",
        "_holders", "_max_tokens", "_waiting",
    )  # fmt: skip

    def __init__(
        self,
        composition: Composition,
        model: PrefillModel,
        params: PlacementParams,
        cache_blocks_per_gpu: int,
        block_size: int,
        started_s: float,
        scan: bool = False,
        compiled: bool | None = None,
    ) -> None:
        """``scan``: place by costing every worker, the reference the search is held to
        (the search needs a monotone profile; without one the shadow scans anyway).
        ``compiled``: search with the compiled twin (:data:`HOT_PATH`; None: where the
        build produced it), the same placements in C."""
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
        self._groups: list[tuple[int, int]] = []
        """Per degree (ascending): its degree and its first worker; its workers are
        contiguous (``degrees`` is sorted)."""
        self._group: list[int] = []
        """Each worker's degree's number in ``_groups``."""
        for w, d in enumerate(self.degrees):
            if not self._groups or self._groups[-1][0] != d:
                self._groups.append((d, w))
            self._group.append(len(self._groups) - 1)
        self._heaps: list[list[tuple[float, int]]] = []
        """Per degree: (free, worker) of its workers, the least first; an entry whose
        free is no longer the worker's is stale and dropped when it comes up."""
        for g, (_, first) in enumerate(self._groups):
            last = self._groups[g + 1][1] if g + 1 < len(self._groups) else len(self.degrees)
            self._heaps.append([(started_s, w) for w in range(first, last)])
        self._holders: dict[int, set[int]] = {}
        """Block key → the workers whose cache holds it."""
        self.scan = scan or not all(monotone(model, d) for d, _ in self._groups)
        if compiled and _Core is None:
            raise ValueError("the compiled shadow was not built (no C compiler)")
        self._core = None
        """The compiled twin, which then keeps the queues and caches (not the fields above)."""
        if (compiled or (compiled is None and _Core is not None)) and not self.scan:
            assert _Core is not None
            self._core = _Core(
                self.degrees,
                self.lam,
                [model.d[d] for d in self.degrees],
                [model.a[d] for d in self.degrees],
                self._max_tokens,
                [c.capacity for c in self.caches],
                model.b,
                model.c,
                model.alpha,
                params.beta,
                params.beta_busy - params.beta,
                block_size,
                started_s,
            )
            self.caches = []
            self._heaps = []
        self.started_s = started_s
        """When it started serving, cold: its first minutes are not yet the composition's."""
        self.arrivals = array("d")
        self.ttfts = array("d")
        """Per request served, in arrival order: its arrival and its TTFT (no T_ext)."""

    def serve(self, request: Request, keys: array | None = None) -> None:
        """Place ``request`` as the pool's cost model would, and record its TTFT.
        ``keys``: its block keys as ``array('Q')``, when the caller has them so."""
        a = request.arrival_s
        if self._core is not None:
            packed = array("Q", request.block_keys) if keys is None else keys
            ttft = self._core.serve(a, request.length, packed)
            if ttft is not None:
                self.arrivals.append(a)
                self.ttfts.append(ttft)
            return
        p = self.params
        beta = self._waiting.beta(a, p.beta, p.beta_busy - p.beta)
        pick = self._scan_all(request, beta) if self.scan else self._search(request, beta)
        if pick is None:
            return  # no worker of this composition can hold it: it is refused, not served
        w, start, e, m = pick
        self.free[w] = start + e
        heapq.heappush(self._heaps[self._group[w]], (start + e, w))
        self._waiting.placed(w, start, a)
        cache = self.caches[w]
        if m:
            cache.touch(request.block_keys, m)
        delta = cache.insert(request.block_keys)
        holders = self._holders
        for k, _, _ in delta.stored:
            holders.setdefault(k, set()).add(w)
        for k in delta.removed:
            held = holders[k]
            held.discard(w)
            if not held:
                del holders[k]
        self.arrivals.append(a)
        self.ttfts.append(start + e - a)

    def _cost(
        self, request: Request, beta: float, w: int, m: int
    ) -> tuple[tuple[float, float, int], float, float]:
        """Worker ``w``'s placement key (cost, then the tie breaks: the longest idle,
        the lowest number) for ``request`` with ``m`` of its blocks cached there, the
        request's start and its prefill time there."""
        a = request.arrival_s
        reused = cached_tokens(m, request.length, self.block_size)
        e = self.model.predict(self.degrees[w], request.length - reused, reused)
        f = self.free[w]
        start = f if f > a else a
        return ((start - a) + (beta + self.lam[w]) * e, f, w), start, e

    def _scan_all(self, request: Request, beta: float) -> tuple[int, float, float, int] | None:
        """Every worker's cost: the reference :meth:`_search` is held to."""
        best: tuple[float, float, int] | None = None
        pick = None
        for w in range(len(self.degrees)):
            if request.length > self._max_tokens[w]:
                continue
            m = self.caches[w].match(request.block_keys)
            key, start, e = self._cost(request, beta, w, m)
            if best is None or key < best:
                best, pick = key, (w, start, e, m)
        return pick

    def _search(self, request: Request, beta: float) -> tuple[int, float, float, int] | None:
        """The worker :meth:`_scan_all` picks, from a few candidates (class docstring)."""
        a = request.arrival_s
        keys = request.block_keys
        best: tuple[float, float, int] | None = None
        pick = None
        seen: set[int] = set()
        soonest: list[tuple[int, float, int]] = []
        """Each degree that can hold the request: its group, the wait of its worker
        free soonest (the least any of its workers can wait) and that worker's match."""
        for g, (_, first) in enumerate(self._groups):
            if request.length > self._max_tokens[first]:
                continue
            heap = self._heaps[g]
            while heap[0][0] != self.free[heap[0][1]]:
                heapq.heappop(heap)
            f, w = heap[0]
            m = self.caches[w].match(keys)
            soonest.append((g, f - a if f > a else 0.0, m))
            key, start, e = self._cost(request, beta, w, m)
            seen.add(w)
            if best is None or key < best:
                best, pick = key, (w, start, e, m)
        if best is None:
            return None
        holders = self._holders
        depth = 0
        while depth < len(keys) and keys[depth] in holders:
            depth += 1
        held_before = 0
        for i in range(depth - 1, -1, -1):
            held = holders[keys[i]]
            if len(held) == held_before:
                continue  # nobody new holds this shorter prefix (the holders nest)
            held_before = len(held)
            # A worker not seen yet holds keys[:i + 1] at most. It costs no less than
            # its degree's soonest wait plus its prefill time with that cached; and
            # if the worker free soonest holds as much, that one is as cheap and
            # wins the tie (free sooner, or as soon and numbered lower).
            level = i + 1
            reused = cached_tokens(level, request.length, self.block_size)
            open_groups = {
                g
                for g, wait, m in soonest
                if m < level
                and wait
                + (beta + self.lam[self._groups[g][1]])
                * self.model.predict(self._groups[g][0], request.length - reused, reused)
                <= best[0]
            }
            if not open_groups:
                break  # and at every shorter prefix: each bound only grows
            # Of a degree's new holders at this level, the one free soonest is the
            # cheapest (the same match): only it is costed.
            new = held - seen
            seen |= new
            soonest_new: dict[int, tuple[float, int]] = {}
            for w in new:
                g = self._group[w]
                if g in open_groups:
                    fw = (self.free[w], w)
                    if g not in soonest_new or fw < soonest_new[g]:
                        soonest_new[g] = fw
            for _, w in soonest_new.values():
                key, start, e = self._cost(request, beta, w, level)
                if key < best:
                    best, pick = key, (w, start, e, level)
        return pick

    def free_times(self) -> list[float]:
        """When each worker (degrees ascending) is next free."""
        return self._core.free_times() if self._core is not None else list(self.free)

    def cached(self, worker: int) -> list[int]:
        """The block keys ``worker`` caches, least recently used first."""
        if self._core is not None:
            return self._core.cached(worker)
        return self.caches[worker].keys_lru_first()

    def nbytes(self) -> int | None:
        """Bytes the compiled twin holds (None for the Python one)."""
        return None if self._core is None else self._core.nbytes()

    def forget_before(self, t: float) -> None:
        """Drop the records of requests that arrived before ``t``, once they are a
        quarter of them: each drop moves the rest, so dropping at every comparison
        would move a 1,024-GPU pool's horizon (~460,000 records) every window."""
        i = bisect.bisect_left(self.arrivals, t)
        if i and 4 * i >= len(self.arrivals):
            del self.arrivals[:i]
            del self.ttfts[:i]


def monotone(model: PrefillModel, degree: int) -> bool:
    """Whether a degree's prefill time falls as more of a prompt of any length is
    cached: dE/dR = a_C − b + (c + α·(L − R + ½)) / C ≥ a_C − b + c / C for R ≤ L
    (:mod:`vertumnus.core.costmodel`), so it does when that is ≥ 0."""
    return model.a[degree] - model.b + model.c / degree >= 0.0


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


SHADOW_BLOCK_TOKENS = 512
"""The shadows' cache blocks hold at least this many tokens: an engine's blocks (16
tokens in SGLang) are taken ``SHADOW_BLOCK_TOKENS // block_size`` at a time, through
every that-many-th chained key, which names the whole prefix up to it. A request
costs a shadow that many times fewer keys, and a shadow's caches that many times
less memory (each cached block ~450 bytes per shadow), for reuse counted to the
coarse block: a prefix shorter than one is not reused there."""


BLOCK_BYTES = 100 if HOT_PATH == "c" else 450
"""What a shadow's caches take per block they hold, in bytes (a filled shadow's
allocations, ``bench/shadow_speed.py``: ~100 compiled, ~450 in Python)."""

SHADOWS_PLANNED = 8
"""The shadows a memory budget is planned for: the current composition and the
probes along its paths (6–7 with the default settings)."""


def block_tokens(pool_cache_tokens: int, budget_bytes: int) -> int:
    """The shadows' block, in tokens: :data:`SHADOW_BLOCK_TOKENS`, doubled while
    :data:`SHADOWS_PLANNED` shadows of a pool caching ``pool_cache_tokens`` would take
    more than ``budget_bytes`` (``PlannerSettings.shadow_memory_mib``). A coarser block
    counts reuse to it: a prefix shorter than one is not reused in the shadows, a
    longer one up to its last whole block."""
    tokens = SHADOW_BLOCK_TOKENS
    while pool_cache_tokens // tokens * SHADOWS_PLANNED * BLOCK_BYTES > budget_bytes:
        tokens *= 2
    return tokens


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
        shadow_block_tokens: int = SHADOW_BLOCK_TOKENS,
    ) -> None:
        """``shadow_block_tokens``: the shadows' block (:func:`block_tokens`), a multiple
        of ``block_size`` tokens or less than one (then the pool's own)."""
        self.model = model
        self.params = params
        self.cache_blocks_per_gpu = cache_blocks_per_gpu
        """The workers' cache size, in the pool's blocks of ``block_size`` tokens."""
        self.stride = max(1, shadow_block_tokens // block_size)
        """The pool's blocks per shadow block (:data:`SHADOW_BLOCK_TOKENS` by default)."""
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
                c,
                self.model,
                self.params,
                max(1, self.cache_blocks_per_gpu // self.stride),
                self.block_size * self.stride,
                self.now_s,
            )

    def serve(self, request: Request) -> None:
        """Every shadow serves ``request`` (the pool's requests, in arrival order)."""
        self.now_s = max(self.now_s, request.arrival_s)
        k = self.stride
        if k > 1:
            request = replace(request, block_keys=request.block_keys[k - 1 :: k])
        keys = array("Q", request.block_keys) if _Core is not None else None
        for s in self.shadows.values():
            s.serve(request, keys)

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
        # Views of the arrays, not copies (gone before the next append resizes them).
        mine_all = np.frombuffer(base.ttfts, dtype=np.float64)
        current_stats: dict[int, tuple[float, float]] = {}
        """The current shadow's mean and P90 from its i-th request on (most
        candidates share a start)."""
        for comp, s in self.shadows.items():
            if comp == current:
                continue
            lo = max(lo_all, since_s, base.started_s + self.warmup_s, s.started_s + self.warmup_s)
            i = bisect.bisect_left(base.arrivals, lo)
            j = bisect.bisect_left(s.arrivals, lo)
            theirs = np.frombuffer(s.ttfts, dtype=np.float64)[j:]
            if len(base.ttfts) - i != len(theirs) or len(theirs) == 0:
                continue  # a request one of them refused: not the same requests
            if i not in current_stats:
                current_stats[i] = (float(mine_all[i:].mean()), whatif.p90(mine_all[i:]))
            mean, p90 = current_stats[i]
            out.append(
                Comparison(
                    comp,
                    len(theirs),
                    self.now_s - lo,
                    1.0 - float(theirs.mean()) / mean,
                    1.0 - whatif.p90(theirs) / p90,
                )
            )
        return out
