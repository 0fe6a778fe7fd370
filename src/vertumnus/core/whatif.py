"""What-if estimates: the TTFT a composition would have given a window's requests (issue 12).

The composition controller's rules (:mod:`vertumnus.core.planner`) read a
window's demand and long share against the capacity profile κ; they never
ask whether another composition would actually have served the window
better. This module answers that question with the cost model, cheaply
enough to ask it every window:

- a :class:`RequestTable` holds the window's requests (arrival, uncached and
  cached tokens) and their predicted prefill time Ê at every degree, computed
  once (numpy) and shared by every candidate;
- :func:`estimate` replays the table on a composition by **list
  scheduling**: each request goes, in arrival order, to the worker that
  minimises wait + (β_i + λ·(C/C_min − 1))·Ê — the placement cost of
  design.md section 3, with its load-dependent β_i — and occupies it for Ê.
  A request's cached prefix counts only at the workers that hold it: the
  last :data:`HOLDERS` that served, earlier in the replay, a request
  carrying that prefix (so the replay keeps cache affinity, and the
  queueing it causes; the bound stands in for eviction). Per request it
  looks at the least-loaded worker of each degree and at the holders of its
  prefix: O(degrees · log workers + HOLDERS);
- a transition is charged as lost capacity: the workers an operation creates
  start free only after its drain and switch (:func:`transition_starts`).

What it leaves out, on purpose (docs/benchmarks/adaptive.md, "Workloads
it was not tuned on"): cache capacity (beyond the :data:`HOLDERS` bound),
prefixes cached before the window (unless :func:`cached_before_anywhere`
credits them everywhere, ``PlannerSettings.whatif_cached_before``, or
:func:`estimate`'s ``held`` starts them where the pool held them,
``whatif_held``), the cache manager's replication, and
what happens after the window (a move must pay back within the window it
is judged on: a load that returns, as in a rate cycle, is not seen).
Pure: no clock, no I/O.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition

__all__ = [
    "HOLDERS",
    "NO_WORKER",
    "Columns",
    "Estimate",
    "RequestTable",
    "WaitingWorkers",
    "best_of",
    "cached_before_anywhere",
    "degree_heaps",
    "estimate",
    "held_holders",
    "holder_rows",
    "holders_on",
    "p90",
    "remember_holder",
    "replay_inputs",
    "reused_key",
    "transition_starts",
]

NO_WORKER = (math.nan, math.nan, False)
"""What :func:`replay_py` records for a request no worker can hold."""

HOLDERS = 8
"""The replay keeps a prefix at the last this-many workers that served it: an LRU
cache forgets what it has not used lately, and a bounded list keeps a request's
cost O(degrees · log workers + HOLDERS) however popular its prefix is."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What one composition would have given the table's requests."""

    composition: Composition
    mean_s: float
    """Mean TTFT (queueing + prefill; T_ext not included), seconds."""
    p90_s: float
    requests: int
    transition_s: float = 0.0
    """When the last worker created by the transition toward it starts serving (0: none)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "composition": str(self.composition),
            "mean_s": round(self.mean_s, 6),
            "p90_s": round(self.p90_s, 6),
            "transition_s": round(self.transition_s, 3),
        }


@dataclass(frozen=True)
class Columns:
    """A window's requests column by column, as :class:`vertumnus.core.windows.ControlWindows`
    keeps them (appended at each placement, so that building the table at the
    window's end is array work, not a Python pass over every request)."""

    arrivals: np.ndarray
    lengths: np.ndarray
    cached: np.ndarray
    """Prefix tokens each request reused."""
    reused: np.ndarray
    """int64: the id of the prefix each request reused (its last cached block), -1: none."""
    n_prefixes: int
    """Prefix ids are below this."""
    carrier_ids: np.ndarray
    """int64, with ``carrier_rows``: pairs (prefix id, row carrying it) for every prefix
    some request of the window reused and every row of the window carrying it. Pairs
    of ids no row reuses may be there, and a pair twice: the replay never reads the
    former, the table drops the latter."""
    carrier_rows: np.ndarray
    """int64: the rows of ``carrier_ids`` (positions in the columns)."""
    workers: np.ndarray | None = None
    """int64: the worker each request was placed on (-1: not known); None: none known."""


def reused_key(keys: Sequence[int], cached_tokens: int, block_size: int) -> int | None:
    """The key of a request's last cached block: the prefix it reused (None: no
    whole block). Chained keys: that one key names the whole prefix."""
    m = min(-(-cached_tokens // block_size), len(keys)) if cached_tokens > 0 else 0
    return keys[m - 1] if m else None


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` for a 1-d integer array: sorted, each value once (numpy 2's
    unique hashes first and sorts after: three times the time of a sort)."""
    out = np.sort(values)
    if out.size > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


class RequestTable:
    """A window's requests with Ê at every degree, ready for :func:`estimate`.

    Each request is (arrival, length, cached tokens, block keys): the tokens
    it reused (or would reuse) and its chained block keys
    (:mod:`vertumnus.core.keys`), from which the table finds the prefix it
    reused (the key of its last cached block) and which of the reused
    prefixes it carries itself (the reused keys among its blocks; the shell
    pairs them at placement, see :class:`vertumnus.core.windows.ControlWindows`).
    Rows are sorted by arrival (stable) and ``arrivals`` made relative to the
    first one. Requests too long for a degree (the model's memory limit) get
    Ê = inf there. ``workers``: per request, the worker of the pool it was placed
    on (for :meth:`held_before`; None: not known).
    """

    __slots__ = (
        "arrivals", "carry_ids", "carry_ptr", "degrees", "hit", "miss", "n", "n_prefixes",
        "reused", "workers", "_absolute", "_lists", "_origin",
    )  # fmt: skip

    def __init__(
        self,
        requests: Sequence[tuple[float, int, int, Sequence[int]]],
        block_size: int,
        model: PrefillModel,
        degrees: Sequence[int],
        workers: Sequence[int] | None = None,
    ) -> None:
        rows = list(requests)
        ids: dict[int, int] = {}  # reused key -> prefix id, in order of first reuse
        reused = []
        for r in rows:
            k = reused_key(r[3], r[2], block_size)
            reused.append(-1 if k is None else ids.setdefault(k, len(ids)))
        pairs = [(ids[k], pos) for pos, r in enumerate(rows) for k in r[3] if k in ids]
        self._fill(
            Columns(
                arrivals=np.array([r[0] for r in rows], dtype=np.float64),
                lengths=np.array([r[1] for r in rows], dtype=np.int64),
                cached=np.array([r[2] for r in rows], dtype=np.int64),
                reused=np.array(reused, dtype=np.int64),
                n_prefixes=len(ids),
                carrier_ids=np.array([i for i, _ in pairs], dtype=np.int64),
                carrier_rows=np.array([pos for _, pos in pairs], dtype=np.int64),
                workers=None if workers is None else np.array(workers, dtype=np.int64),
            ),
            model,
            degrees,
        )

    @classmethod
    def of_columns(
        cls, columns: Columns, model: PrefillModel, degrees: Sequence[int]
    ) -> RequestTable:
        """The table of a window the shell kept column by column (:class:`Columns`):
        the same table as from its rows, without a pass over them in Python."""
        table = cls.__new__(cls)
        table._fill(columns, model, degrees)
        return table

    def _fill(self, columns: Columns, model: PrefillModel, degrees: Sequence[int]) -> None:
        """The table from its columns (in the shell's order): rows sorted by arrival
        (stable), the prefixes each carries as CSR, Ê at every degree."""
        arrivals = columns.arrivals.astype(np.float64)
        total = columns.lengths.astype(np.float64)
        cached = columns.cached.astype(np.int64)
        n = self.n = len(arrivals)
        reused = columns.reused.astype(np.int64)
        carrier, carried = columns.carrier_rows, columns.carrier_ids
        rank = np.arange(n)
        self._origin = rank  # new row -> the shell's position
        if n > 1 and bool(np.any(np.diff(arrivals) < 0)):
            order = self._origin = np.argsort(arrivals, kind="stable")
            arrivals, total = arrivals[order], total[order]
            cached, reused = cached[order], reused[order]
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n)  # old row -> new row
        # By row, and within a row by prefix id (the order the replay reads them in),
        # each pair once.
        width = max(1, columns.n_prefixes)
        pairs = _distinct(rank[carrier] * width + carried)
        rows_of = pairs // width
        self.carry_ids = pairs - rows_of * width
        self.carry_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows_of, minlength=n), out=self.carry_ptr[1:])
        self._absolute = arrivals
        self.arrivals = arrivals - arrivals[0] if n else arrivals
        self.reused = reused
        placed_on = columns.workers
        self.workers = (
            np.full(n, -1, dtype=np.int64)
            if placed_on is None
            else placed_on.astype(np.int64)[self._origin]
        )
        """The worker each row was placed on in the pool (-1: not known)."""
        self.n_prefixes = columns.n_prefixes
        reused_tokens = np.minimum(cached.astype(np.float64), total)
        self.degrees = tuple(sorted(set(degrees)))
        self.hit = np.empty((len(self.degrees), n))
        self.miss = np.empty((len(self.degrees), n))
        for row, d in enumerate(self.degrees):
            for out, prefix in ((self.hit, reused_tokens), (self.miss, np.zeros_like(total))):
                new = total - prefix
                pairs = new * prefix + new * (new + 1.0) / 2.0
                e = (
                    model.d[d]
                    + model.a[d] * new
                    + model.b * prefix
                    + (model.c * new + model.alpha * pairs) / d
                )
                e[total > model.max_tokens(d)] = math.inf
                out[row] = e
        self._lists: tuple[list[float], list[int], list[list[int]]] | None = None

    def since(self, first: int) -> RequestTable:
        """The table of the requests the shell gave from position ``first`` on (the
        newest hops of its window), cut from this one: the estimates of the table
        :meth:`of_columns` builds from their columns alone, without building it.

        Why they are the same: rows keep their order (a stable sort by arrival
        of a subset is the subset of the stable sort), Ê is per row, arrivals
        are made relative to the subset's first, and the prefix ids of the
        whole window stay: a row that reuses a prefix finds the holders that
        rows of the subset made, and ids no row of the subset reuses are never
        read."""
        keep = np.flatnonzero(self._origin >= first)
        cut = RequestTable.__new__(RequestTable)
        cut.n = m = len(keep)
        cut.degrees = self.degrees
        cut._origin = self._origin[keep] - first
        cut._absolute = self._absolute[keep]
        cut.arrivals = cut._absolute - cut._absolute[0] if m else cut._absolute
        cut.reused = self.reused[keep]
        cut.workers = self.workers[keep]
        cut.n_prefixes = self.n_prefixes
        cut.hit = np.ascontiguousarray(self.hit[:, keep])
        cut.miss = np.ascontiguousarray(self.miss[:, keep])
        begin, counts = self.carry_ptr[keep], np.diff(self.carry_ptr)[keep]
        cut.carry_ptr = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(counts, out=cut.carry_ptr[1:])
        # Each kept row's run of carried ids, in order.
        at = np.repeat(begin - cut.carry_ptr[:-1], counts) + np.arange(cut.carry_ptr[-1])
        cut.carry_ids = self.carry_ids[at]
        cut._lists = None
        return cut

    def lists(self) -> tuple[list[float], list[int], list[list[int]]]:
        """Arrivals, reused prefix ids and carried prefix ids as lists (the Python replay)."""
        if self._lists is None:
            ptr, ids = self.carry_ptr.tolist(), self.carry_ids.tolist()
            carries = [ids[ptr[i] : ptr[i + 1]] for i in range(self.n)]
            self._lists = (self.arrivals.tolist(), self.reused.tolist(), carries)
        return self._lists

    def cached_before(self) -> np.ndarray:
        """Per row, whether the prefix it reuses was cached before the table's first
        row: no earlier row carries it (the pool had it from a request before)."""
        rows_of = np.repeat(np.arange(self.n), np.diff(self.carry_ptr))
        first = np.full(max(1, self.n_prefixes), self.n, dtype=np.int64)
        np.minimum.at(first, self.carry_ids, rows_of)
        return (self.reused >= 0) & (first[np.maximum(self.reused, 0)] >= np.arange(self.n))

    def held_before(self) -> np.ndarray:
        """Per prefix id, the worker of the pool that held it before the table's first
        row (-1: none, or not known): where the pool served the first row reusing a
        prefix :meth:`cached_before` (it reused it there, so that worker had it).
        Read with :func:`holders_on` for a composition's replay
        (``PlannerSettings.whatif_held``)."""
        held = np.full(max(1, self.n_prefixes), -1, dtype=np.int64)
        rows = np.flatnonzero(self.cached_before() & (self.workers >= 0))
        if rows.size:
            # The first such row of each prefix (rows ascend: unique's first index).
            ids, first = np.unique(self.reused[rows], return_index=True)
            held[ids] = self.workers[rows[first]]
        return held


def estimate(
    table: RequestTable,
    composition: Composition,
    params: PlacementParams,
    starts: Mapping[int, Sequence[float]] | None = None,
    variant: Callable[..., list[float]] | None = None,
    held: np.ndarray | None = None,
) -> Estimate:
    """Mean and P90 TTFT of ``table`` on ``composition`` by list scheduling (module docstring).

    ``starts``: degree → the times (relative to the first arrival) at which
    some of that degree's workers *start* serving — the workers a
    transition creates; the others serve from the start. A request no
    worker can hold counts with the largest finite TTFT seen (it would be
    refused, not served). ``variant``: a Python replay with :func:`replay_py`'s
    arguments and result, to run instead of the shipped one (a variant
    measured against it, as ``bench/whatif_vs_sim.py --ties first`` does).
    ``held``: per prefix id, the worker of the replay (numbered degree by degree,
    ascending, each degree's late starters last: :func:`holders_on`) that holds it
    at the start (-1: none); None: every prefix starts uncached.
    """
    counts = Counter(composition.degrees)
    late = starts or {}
    degs = sorted(counts)
    for d in degs:
        if d not in table.degrees:
            raise ValueError(f"degree {d} is not in the request table (it has {table.degrees})")
    index = [table.degrees.index(d) for d in degs]
    worker_starts = []
    for d in degs:
        delayed = sorted(late.get(d, ()))[: counts[d]]
        worker_starts.append([0.0] * (counts[d] - len(delayed)) + [float(t) for t in delayed])
    lam_terms = [params.lam * (d / degs[0] - 1.0) for d in degs]
    extra = params.beta_busy - params.beta
    values = np.empty(table.n)
    if table.n and variant is not None:
        more = {} if held is None else {"held": held}
        values[:] = variant(table, index, worker_starts, lam_terms, params.beta, extra, **more)
    elif table.n and HOT_PATH == "c":
        replay(
            table.arrivals, table.hit, table.miss, index, table.reused, table.carry_ptr,
            table.carry_ids, table.n_prefixes, worker_starts, lam_terms, params.beta, extra,
            values, held,
        )  # fmt: skip
    elif table.n:
        values[:] = replay_py(table, index, worker_starts, lam_terms, params.beta, extra, held=held)
    if values.size and np.isnan(values).any():
        finite = values[~np.isnan(values)]
        values[np.isnan(values)] = finite.max() if finite.size else 0.0
    last = max((max(v) for v in late.values() if v), default=0.0)
    return Estimate(
        composition,
        float(values.mean()) if values.size else 0.0,
        p90(values) if values.size else 0.0,
        table.n,
        float(last),
    )


def cached_before_anywhere(table: RequestTable) -> RequestTable:
    """``table`` with every prefix cached before its first request held by every worker
    at its first reuse (``PlannerSettings.whatif_cached_before``): a row that reuses a
    prefix no earlier row carries costs its cached Ê on any worker, where the
    replay, starting cold, charges it uncached on every worker (in the pool it is
    cached at the worker that served the conversation before). Where it goes then
    holds it for the rows after it, as in the replay. A new table; ``table`` is
    left as it is."""
    warm = copy.copy(table)
    warm.miss = np.ascontiguousarray(np.where(table.cached_before(), table.hit, table.miss))
    return warm


def holder_rows(held_before: np.ndarray, workers: np.ndarray) -> np.ndarray:
    """:meth:`RequestTable.held_before` (prefix id → pool worker) as positions in
    ``workers`` (sorted ids; -1: none, or a worker not there)."""
    at = np.searchsorted(workers, held_before)
    inside = at < workers.size
    found = inside & (workers[np.where(inside, at, 0)] == held_before) & (held_before >= 0)
    return np.where(found, at, -1)


def holders_on(rows: np.ndarray, heirs: np.ndarray) -> np.ndarray:
    """Per prefix id, the replay's worker that holds it at the start (:func:`estimate`'s
    ``held``; -1: none): ``rows`` (:func:`holder_rows`) read in ``heirs``, per pool
    worker the replay's workers that hold its prefixes (a prefix in column
    ``id % columns``: a split deals its worker's prefixes between its halves)."""
    column = np.arange(rows.size) % heirs.shape[1]
    return np.where(rows >= 0, heirs[np.maximum(rows, 0), column], -1)


def p90(values: np.ndarray) -> float:
    """``np.percentile(values, 90)`` bit for bit (its default, linear method) for a
    float64 array without nan: the two order statistics it interpolates between,
    found by a selection, without the generic function's overhead (a third of a
    millisecond per estimate of a 15,000-request window)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    n = values.size
    virtual = (n - 1) * 0.9
    if virtual >= n - 1:
        return float(values.max())
    lo = math.floor(virtual)
    if HOT_PATH == "c":
        # The compiled twin: the same two order statistics, a fifth of the time.
        a, b = order_pair(values, lo)
    else:
        # One kth, then the least above it: the (lo + 1)-th order statistic, and
        # about five times faster than numpy's partition around two kths.
        part = np.partition(values, lo)
        a, b = float(part[lo]), float(part[lo + 1 :].min())
    t = virtual - lo
    diff = b - a
    # numpy's _lerp: from the nearer end, so that t = 1 gives b exactly.
    return b - diff * (1.0 - t) if t >= 0.5 else a + diff * t


def replay_py(
    table: RequestTable,
    index: Sequence[int],
    worker_starts: Sequence[Sequence[float]],
    lam_terms: Sequence[float],
    beta: float,
    extra: float,
    record: list[tuple[float, float, bool]] | None = None,
    held: np.ndarray | None = None,
) -> list[float]:
    """The list-scheduling replay of :func:`estimate` (pure Python; ``_whatif.c`` is its
    compiled twin, the same floats): per request its TTFT, nan if no worker can hold it.

    ``index``: the table rows of the composition's degrees (ascending);
    ``worker_starts``: per degree, when each of its workers starts serving;
    ``lam_terms``: λ·(C/C_min − 1) per degree; β_i = ``beta`` + ``extra``·(share of
    workers with a request waiting), as placement computes it. ``record`` (a
    diagnostic, ``bench/whatif_vs_sim.py --decompose``): appended per request, its
    wait, its prefill time and whether it reused its prefix (:data:`NO_WORKER` for a
    request no worker can hold). ``held``: as :func:`estimate`'s.
    """
    arrivals, reused, carries, hits, misses, free, row_of = replay_inputs(
        table, index, worker_starts
    )
    heaps = degree_heaps(free, row_of, len(worker_starts))
    waiting = WaitingWorkers(len(free))
    holders = held_holders(held, table.n_prefixes, len(free))
    """Reused prefix id → the (at most ``HOLDERS``) workers that served it last, least
    recent first (a dict: ordered, as the compiled twin's arrays)."""
    ttft: list[float] = []
    rows = range(len(heaps))
    for i, a in enumerate(arrivals):
        b = waiting.beta(a, beta, extra)
        hold = holders.get(reused[i], {}) if reused[i] >= 0 else {}
        best_w, best_cost, best_start, best_e = -1, math.inf, 0.0, 0.0
        # The least-loaded worker of each degree (its cached prefix only if it
        # holds it), then every holder of the prefix the request reuses.
        for k in rows:
            heap = heaps[k]
            while heap[0][0] != free[heap[0][1]]:
                heapq.heappop(heap)
            f, w = heap[0]
            e = hits[k][i] if w in hold else misses[k][i]
            start = f if f > a else a
            cost = (start - a) + (b + lam_terms[k]) * e
            if cost < best_cost:
                best_w, best_cost, best_start, best_e = w, cost, start, e
        for w in hold:
            k = row_of[w]
            f = free[w]
            e = hits[k][i]
            start = f if f > a else a
            cost = (start - a) + (b + lam_terms[k]) * e
            if cost < best_cost:
                best_w, best_cost, best_start, best_e = w, cost, start, e
        if record is not None:
            record.append((best_start - a, best_e, best_w in hold) if best_w >= 0 else NO_WORKER)
        if best_w < 0:
            ttft.append(math.nan)
            continue
        finish = best_start + best_e
        free[best_w] = finish
        heapq.heappush(heaps[row_of[best_w]], (finish, best_w))
        waiting.placed(best_w, best_start, a)
        remember_holder(holders, carries[i], best_w)
        ttft.append(finish - a)
    return ttft


def replay_inputs(
    table: RequestTable, index: Sequence[int], worker_starts: Sequence[Sequence[float]]
) -> tuple[
    list[float],
    list[int],
    list[list[int]],
    list[list[float]],
    list[list[float]],
    list[float],
    list[int],
]:
    """What a Python replay reads, as lists: the table's arrivals, reused prefix ids and
    carried prefixes; per degree row of ``index`` the hit and miss times; per worker
    (numbered degree by degree) when it is free first and its row."""
    arrivals, reused, carries = table.lists()
    hits = [table.hit[k].tolist() for k in index]
    misses = [table.miss[k].tolist() for k in index]
    free = [f for frees in worker_starts for f in frees]
    row_of = [k for k, frees in enumerate(worker_starts) for _ in frees]
    return arrivals, reused, carries, hits, misses, free, row_of


def degree_heaps(
    free: Sequence[float], row_of: Sequence[int], degrees: int
) -> list[list[tuple[float, int]]]:
    """Per degree row of a Python replay (:func:`replay_inputs`), a heap of (free time,
    worker) of its workers, to be lazily updated: an entry is current while it equals
    ``free[worker]``."""
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(degrees)]
    for w, (f, k) in enumerate(zip(free, row_of, strict=True)):
        heaps[k].append((f, w))
    for heap in heaps:
        heapq.heapify(heap)
    return heaps


def held_holders(
    held: np.ndarray | None, n_prefixes: int, n_workers: int
) -> dict[int, dict[int, None]]:
    """The holders a Python replay starts from: per prefix id, the worker ``held``
    names (:func:`estimate`'s; -1 or a worker not in the replay: none)."""
    holders: dict[int, dict[int, None]] = {}
    if held is not None:
        for pid, w in enumerate(held[:n_prefixes].tolist()):
            if 0 <= w < n_workers:
                holders[pid] = {w: None}
    return holders


class WaitingWorkers:
    """The workers with a request waiting in a replay: the last request given to one
    has not started yet. β_i grows with their share, as placement's load-dependent β
    grows with the share of workers with a queue."""

    __slots__ = ("_last_start", "_pending", "_share_of", "_waiting")

    def __init__(self, n_workers: int) -> None:
        self._last_start = [0.0] * n_workers
        self._waiting: set[int] = set()
        # When each waiting worker stops waiting (stale entries are skipped).
        self._pending: list[tuple[float, int]] = []
        self._share_of = n_workers

    def beta(self, arrival: float, beta: float, extra: float) -> float:
        """β_i for a request arriving at ``arrival`` = ``beta`` + ``extra``·(share of
        workers with a request waiting then)."""
        pending = self._pending
        while pending and pending[0][0] <= arrival:
            s0, w0 = heapq.heappop(pending)
            if self._last_start[w0] == s0:
                self._waiting.discard(w0)
        if extra == 0.0:
            return beta
        return beta + extra * len(self._waiting) / self._share_of

    def placed(self, worker: int, start: float, arrival: float) -> None:
        """A request arriving at ``arrival`` goes to ``worker`` and starts at ``start``."""
        self._last_start[worker] = start
        if start > arrival:
            self._waiting.add(worker)
            heapq.heappush(self._pending, (start, worker))


def remember_holder(
    holders: dict[int, dict[int, None]],
    carried: Iterable[int],
    worker: int,
    bound: int = HOLDERS,
) -> None:
    """``worker`` served a request carrying the prefixes ``carried``: it becomes their
    most recent holder, and a prefix held by ``bound`` workers already forgets the
    least recent one (it has evicted it). ``holders``: prefix id → its holders, least
    recent first (a dict: ordered, as the compiled twin's arrays)."""
    for pid in carried:
        held = holders.get(pid)
        if held is None:
            holders[pid] = {worker: None}
            continue
        if worker in held:
            del held[worker]  # most recent last
        elif len(held) >= bound:
            del held[next(iter(held))]
        held[worker] = None


def transition_starts(
    steps: Sequence[tuple[float, Sequence[int]]], switch_s: float, concurrent: int
) -> dict[int, list[float]]:
    """When the workers a transition creates start serving.

    ``steps``: per operation, in order, its drain time (the longest running
    prefill of its members) and the degrees of the workers it creates.
    Operations run ``concurrent`` at a time (the executor's limit), each
    batch after the previous one has committed; an operation's workers start
    after its batch's longest drain plus ``switch_s``.
    """
    out: dict[int, list[float]] = {}
    t = 0.0
    for b in range(0, len(steps), max(1, concurrent)):
        batch = steps[b : b + max(1, concurrent)]
        t += max(drain for drain, _ in batch) + switch_s
        for _, made in batch:
            for d in made:
                out.setdefault(d, []).append(t)
    return out


def best_of(
    table: RequestTable,
    candidates: Sequence[Composition],
    params: PlacementParams,
) -> tuple[Composition, list[Estimate]]:
    """The candidate with the lowest estimated mean TTFT on ``table`` (ties: the first),
    and every estimate, in the candidates' order."""
    if not candidates:
        raise ValueError("no candidate compositions")
    found = [estimate(table, c, params) for c in candidates]
    best = min(range(len(found)), key=lambda i: (found[i].mean_s, i))
    return candidates[best], found


# The replay's hot path: the compiled twin of replay_py (_whatif.c, the same
# floats) where the build produced it, else the Python function.
HOT_PATH: str
try:
    from vertumnus.core._whatif import order_pair, replay
except ImportError:  # built without a C compiler
    HOT_PATH = "python"
else:
    HOT_PATH = "c"
