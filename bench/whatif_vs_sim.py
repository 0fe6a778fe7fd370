"""The what-if replay against the simulator on the same requests (issue 12: tracing the
estimate's bias).

The composition controller's check (:mod:`vertumnus.core.whatif`) estimates, by a
cost-model replay, the mean TTFT each candidate composition would give. This
command puts that estimate next to what the simulator measures, on one whole
stretch of a workload, so that a bias shows as two ratios that disagree:

1. the simulator serves the stream on each composition (cost-model placement,
   fixed pool), scored from ``--skip-s`` on, T_ext taken out (the replay leaves
   it out);
2. the replay serves the same requests from ``--skip-s`` on, with the cached
   tokens each got on the *first* composition (as the controller's window
   holds the tokens served on the current composition), starting cold.

``--no-reuse SCALE`` gives every request unique block keys (no prefix reuse at
all) and stretches arrivals by SCALE to keep the load comparable: the check of
queueing and placement alone. ``--beta-busy`` sets β_busy on both sides.
``--windows SECONDS`` also replays the scored requests window by window, as the
controller does (each window cold, with the cached tokens of the first
composition), and prints each composition's gain over the first, on the mean
TTFT and on the P90: the mean over the windows and their standard deviation
(how noisy one window's estimate is), next to the simulator's gain on the
whole stretch. ``--decompose`` also splits each composition's TTFT per request into
its wait and its prefill time, and counts the tokens reused, in the simulator and in
the replay (window by window with ``--windows``): where the two part ways
(docs/benchmarks/adaptive.md, "The estimate's bias on mooncake, again"); with
``--cached-before held`` also the windows replayed from the pool's cache
(docs/benchmarks/adaptive.md, "The recall reads the mix since the change").
``--cached-before anywhere`` (with ``--windows``) also replays each window with every
prefix cached before it held by every worker at its first reuse
(:func:`vertumnus.core.whatif.cached_before_anywhere`, the controller's
``whatif_cached_before``): where the cold windows' missing reuse, not
queueing, is what the estimate gets wrong, this column comes closer
(docs/benchmarks/adaptive.md, "1,024 GPUs heavy: the estimate's cold windows").
``--cached-before held`` replays each window instead from where the first
composition's simulated pool held each prefix before it (the controller's
``whatif_held``): the first composition as it is, each other one after the
path of splits or merges the controller's walk takes to it from the first, whole
(the check itself probes at most ``max_walk`` steps of a path), as its steady
replay: no transition paid; "n/a" where no one-way path leads there.
``--ancestors`` (with ``--cached-before held``) adds those windows replayed by a
variant (:func:`ancestors_replay`): a request reuses the longest shorter prefix a
worker holds where its whole one is not held, and a prefix keeps every worker that
served it (docs/benchmarks/adaptive.md, "The recall reads the mix since the change").
``--phases SPEC`` (with ``--seed``) reshapes ``--trace`` as
``vertumnus simulate --phases`` does. ``--ties first`` adds a third column: the replay breaking ties as placement
did until 2026-12-04 (of equal costs the lower worker, so the first idle worker
takes a request no cache draws) instead of giving it the longest-idle worker,
as the shipped replay and, since then, placement do (:func:`first_idle_replay`;
docs/benchmarks/adaptive.md, "Where the estimate's bias comes from: which idle
worker").

    python bench/whatif_vs_sim.py --family toolagent --load moderate --draw 1
    python bench/whatif_vs_sim.py --trace synthetic:preset=toolagent,mean_rate=44,duration_s=900
    python bench/whatif_vs_sim.py --trace synthetic:preset=toolagent,mean_rate=44,duration_s=900 \\
        --no-reuse 4.5
    python bench/whatif_vs_sim.py --family toolagent --load moderate --draw 1 --ties first
    python bench/whatif_vs_sim.py --family toolagent --load moderate --draw 0 --gpus 256 \\
        --windows 20 --compositions 62xCP4+1xCP8,64xCP4
    python bench/whatif_vs_sim.py --family mooncake --load light --draw 2 --windows 20 \
        --compositions 6xCP4+2xCP8,8xCP4+1xCP8,10xCP4 --decompose
    python bench/whatif_vs_sim.py --trace ../shared/traces/mooncake/conversation_trace.jsonl \
        --phases "1125s:rate=2.5,long=5" --seed 3 --windows 20 \
        --compositions 4xCP4+3xCP8,2xCP4+4xCP8,6xCP4+2xCP8

Prints one line per composition; ~30 s per run on 2 cores.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402  (the workload families and their cells)

from vertumnus.core import planner, probes, whatif  # noqa: E402
from vertumnus.core.metrics import summarize  # noqa: E402
from vertumnus.core.placement import PlacementParams  # noqa: E402
from vertumnus.core.policies.vertumnus import CostModelPolicy  # noqa: E402
from vertumnus.core.types import Composition, Request  # noqa: E402
from vertumnus.profiles import load_model  # noqa: E402
from vertumnus.sim.engine import PoolConfig, Simulation  # noqa: E402
from vertumnus.sim.phases import apply_phases  # noqa: E402
from vertumnus.sim.traces import Trace, load_trace  # noqa: E402


def _stream(args: argparse.Namespace) -> tuple[Trace, float]:
    """The requests and the time scoring starts at."""
    if args.trace:
        trace = load_trace(args.trace)
        if args.phases:
            trace, _ = apply_phases(trace, args.phases, seed=args.seed)
        return trace, args.skip_s
    if not (args.family and args.load):
        raise SystemExit("give --trace SPEC, or --family and --load (and --draw)")
    trace, _ = families.workload(args.family, args.load, args.draw, args.gpus, args.spread)
    return trace, families.WARMUP_S if args.draw is not None else args.skip_s


def without_reuse(requests: list[Request], scale: float) -> list[Request]:
    """``requests`` with no prefix in common (every block key unique) and arrivals
    stretched by ``scale``."""
    return [
        replace(
            q,
            arrival_s=q.arrival_s * scale,
            block_keys=tuple((q.id << 20) + i + 1 for i in range(len(q.block_keys))),
        )
        for q in requests
    ]


def first_idle_replay(
    table: whatif.RequestTable,
    index: Sequence[int],
    worker_starts: Sequence[Sequence[float]],
    lam_terms: Sequence[float],
    beta: float,
    extra: float,
) -> list[float]:
    """:func:`vertumnus.core.whatif.replay_py` with placement's former tie-break: of
    equal costs the lower worker, so a degree's first candidate is its idle worker of the
    lowest index (every idle worker waits 0), else its least-loaded one. The
    shipped replay takes the least (free time, worker): the longest-idle worker.
    Same arguments and result; ``whatif.estimate(..., variant=first_idle_replay)``
    scores it as the shipped replay is scored."""
    arrivals, reused, carries, hits, misses, free, row_of = whatif.replay_inputs(
        table, index, worker_starts
    )
    # Per degree the workers busy at the last arrival (a heap of (free time,
    # worker)) and the idle ones (a heap of workers); both lazy: a busy entry is
    # current while it equals free[worker], an idle one while the worker is free.
    busy = whatif.degree_heaps(free, row_of, len(worker_starts))
    idle: list[list[int]] = [[] for _ in worker_starts]
    waiting = whatif.WaitingWorkers(len(free))
    holders: dict[int, dict[int, None]] = {}
    ttft: list[float] = []
    for i, a in enumerate(arrivals):
        b = waiting.beta(a, beta, extra)
        hold = holders.get(reused[i], {}) if reused[i] >= 0 else {}
        candidates = []
        for k in range(len(busy)):
            heap, free_ones = busy[k], idle[k]
            while heap and (heap[0][0] != free[heap[0][1]] or heap[0][0] <= a):
                f, w = heapq.heappop(heap)
                if f == free[w]:
                    heapq.heappush(free_ones, w)
            while free_ones and free[free_ones[0]] > a:
                heapq.heappop(free_ones)
            candidates.append(free_ones[0] if free_ones else heap[0][1])
        candidates.extend(hold)
        best: tuple[float, int] = (math.inf, -1)
        best_start = best_e = 0.0
        for w in candidates:
            k = row_of[w]
            e = hits[k][i] if w in hold else misses[k][i]
            start = max(free[w], a)
            cost = (start - a) + (b + lam_terms[k]) * e
            if (cost, w) < best:
                best, best_start, best_e = (cost, w), start, e
        w = best[1]
        if w < 0:
            ttft.append(math.nan)
            continue
        free[w] = best_start + best_e
        heapq.heappush(busy[row_of[w]], (free[w], w))
        waiting.placed(w, best_start, a)
        whatif.remember_holder(holders, carries[i], w)
        ttft.append(free[w] - a)
    return ttft


def ancestor_levels(
    rows: Sequence[tuple[float, int, int, Sequence[int]]], block_size: int
) -> list[list[tuple[int, int]]]:
    """Per row of a table built from ``rows`` (in arrival order), the shorter prefixes
    of the one it reuses that some row of the table reuses whole: (prefix id, tokens),
    shortest first. Ids as :class:`~vertumnus.core.whatif.RequestTable` numbers them
    (in order of first reuse)."""
    ids: dict[int, int] = {}
    for r in rows:
        k = whatif.reused_key(r[3], r[2], block_size)
        if k is not None:
            ids.setdefault(k, len(ids))
    out = []
    for length, cached, keys in ((r[1], r[2], r[3]) for r in rows):
        m = min(-(-cached // block_size), len(keys)) if cached > 0 else 0
        out.append(
            [
                (ids[k], min((j + 1) * block_size, length))
                for j, k in enumerate(keys[: max(0, m - 1)])
                if k in ids
            ]
        )
    return out


def ancestors_replay(
    table: whatif.RequestTable,
    index: Sequence[int],
    worker_starts: Sequence[Sequence[float]],
    lam_terms: Sequence[float],
    beta: float,
    extra: float,
    levels: Sequence[Sequence[tuple[int, int]]] = (),
    lengths: Sequence[int] = (),
    held: np.ndarray | None = None,
) -> list[float]:
    """:func:`vertumnus.core.whatif.replay_py` with two things the shipped replay leaves
    out (``--ancestors``; docs/benchmarks/adaptive.md, "The recall reads the mix since
    the change"): where a request's prefix is not held, it reuses the longest of its
    ``levels`` (:func:`ancestor_levels`) that is, and the holders of those are
    candidates too; and a prefix keeps every worker that served it, not the last
    :data:`~vertumnus.core.whatif.HOLDERS`. A variant to measure, not to ship: with a
    prefix every request shares, each request looks at every worker."""
    model = load_model()
    degrees = [table.degrees[k] for k in index]
    arrivals, reused, carries, hits, misses, free, row_of = whatif.replay_inputs(
        table, index, worker_starts
    )
    heaps = whatif.degree_heaps(free, row_of, len(worker_starts))
    waiting = whatif.WaitingWorkers(len(free))
    # Prefix id -> every worker that served it, least recent first (as the shipped
    # replay's bounded lists; candidates are read in that order).
    holders = whatif.held_holders(held, table.n_prefixes, len(free))
    ttft: list[float] = []
    for i, a in enumerate(arrivals):
        b = waiting.beta(a, beta, extra)
        hold = holders.get(reused[i], {}) if reused[i] >= 0 else {}

        def prefill(w: int, k: int, i: int = i, hold: dict[int, None] = hold) -> float:
            if w in hold:
                return hits[k][i]
            for pid, tokens in reversed(levels[i]):
                if w in holders.get(pid, ()) and math.isfinite(misses[k][i]):
                    return model.predict(degrees[k], lengths[i] - tokens, tokens)
            return misses[k][i]

        candidates = []
        for heap in heaps:
            while heap[0][0] != free[heap[0][1]]:
                heapq.heappop(heap)
            candidates.append(heap[0][1])
        candidates += hold
        for pid, _ in levels[i]:
            candidates += holders.get(pid, {})
        best: tuple[float, int] = (math.inf, -1)
        best_start = best_e = 0.0
        for w in candidates:
            k = row_of[w]
            e = prefill(w, k)
            start = max(free[w], a)
            cost = (start - a) + (b + lam_terms[k]) * e
            if cost < best[0]:
                best, best_start, best_e = (cost, w), start, e
        w = best[1]
        if w < 0:
            ttft.append(math.nan)
            continue
        free[w] = best_start + best_e
        heapq.heappush(heaps[row_of[w]], (free[w], w))
        waiting.placed(w, best_start, a)
        # Bounded by the pool: no worker is forgotten.
        whatif.remember_holder(holders, carries[i], w, bound=len(free))
        ttft.append(free[w] - a)
    return ttft


class Comparison(NamedTuple):
    """Per composition, mean TTFT without T_ext of the scored requests."""

    sim_s: list[float]
    replay_s: list[float]
    requests: int
    first_idle_s: list[float]
    """The replay with placement's former tie-break (empty unless asked for)."""
    cached: dict[int, int]
    """Request id → the tokens it reused on the first composition."""
    served: list[dict[int, tuple[float, float, int]]]
    """Per composition, scored request id → its wait, its prefill time and the tokens it
    reused in the simulator (seconds, T_ext out)."""
    sim_p90_s: list[float]
    """Per composition, the simulator's P90 TTFT without T_ext."""
    workers: dict[int, int]
    """Request id → the worker it was placed on in the first composition."""


def replay_rows(
    requests: list[Request], cached: dict[int, int], start: float, end: float
) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """The replay's rows of the requests arriving in [``start``, ``end``), with the
    tokens each reused on the first composition (``cached``)."""
    return [
        (q.arrival_s, q.length, cached[q.id], q.block_keys)
        for q in requests
        if start <= q.arrival_s < end
    ]


def compare(
    requests: list[Request],
    block_size: int,
    comps: list[Composition],
    params: PlacementParams,
    skip_s: float,
    first_idle: bool = False,
) -> Comparison:
    """The simulator and the replay (with ``first_idle``, also the replay with
    placement's former tie-break) on the requests from ``skip_s`` on (module docstring)."""
    model = load_model()
    cached: dict[int, int] = {}
    workers: dict[int, int] = {}
    sim_s: list[float] = []
    sim_p90_s: list[float] = []
    served: list[dict[int, tuple[float, float, int]]] = []
    for comp in comps:
        pool = PoolConfig(comp, model, block_size=block_size)
        run = Simulation(pool, CostModelPolicy(params)).run(requests)
        done = [c for c in run.completions if c.arrival_s >= skip_s]
        summary = summarize(done)
        sim_s.append(summary.mean_ttft_s - pool.t_ext_s)
        sim_p90_s.append(summary.p90_ttft_s - pool.t_ext_s)
        if not cached:
            cached = {c.request_id: c.cached_tokens for c in run.completions}
            workers = {c.request_id: c.worker for c in run.completions}
        each = {}
        for c in done:
            p = min(c.cached_tokens, c.length)
            prefill = model.predict(c.degree, c.length - p, p)
            each[c.request_id] = (c.ttft_s - pool.t_ext_s - prefill, prefill, c.cached_tokens)
        served.append(each)
    rows = replay_rows(requests, cached, skip_s, math.inf)
    degrees = sorted({d for c in comps for d in c.degrees})
    table = whatif.RequestTable(rows, block_size, model, degrees)
    return Comparison(
        sim_s,
        [whatif.estimate(table, c, params).mean_s for c in comps],
        len(rows),
        [whatif.estimate(table, c, params, variant=first_idle_replay).mean_s for c in comps]
        if first_idle
        else [],
        cached,
        served,
        sim_p90_s,
        workers,
    )


def windows(requests: list[Request], skip_s: float, window_s: float) -> Iterator[list[Request]]:
    """The requests of each whole window of ``window_s`` from ``skip_s`` on that holds at
    least 20, in arrival order: the windows the controller would replay."""
    ordered = sorted(requests, key=lambda q: q.arrival_s)
    start, end = skip_s, ordered[-1].arrival_s
    while start + window_s <= end:
        inside = [q for q in ordered if start <= q.arrival_s < start + window_s]
        start += window_s
        if len(inside) >= 20:
            yield inside


def window_gains(
    requests: list[Request],
    cached: dict[int, int],
    block_size: int,
    comps: list[Composition],
    params: PlacementParams,
    skip_s: float,
    window_s: float,
    anywhere: bool = False,
    placed_on: dict[int, int] | None = None,
    ancestors: bool = False,
) -> np.ndarray:
    """Per window (:func:`windows`), each composition's estimated gain over the first,
    the window replayed on its own as the controller replays one: rows are windows,
    columns compositions, and the last axis the gain of the mean TTFT and of the P90.
    ``anywhere``: the prefixes cached before each window hit anywhere
    (:func:`vertumnus.core.whatif.cached_before_anywhere`). ``placed_on`` (request id →
    its worker on the first composition): each replay starts where that pool held
    the prefixes (module docstring, ``--cached-before held``; nan where no path).
    ``ancestors`` (with ``placed_on``): with :func:`ancestors_replay` instead of the
    shipped replay (``--ancestors``)."""
    model = load_model()
    degrees = sorted({d for c in comps for d in c.degrees})
    inherit = None if placed_on is None else held_paths(comps, degrees)
    gains = []
    for inside in windows(requests, skip_s, window_s):  # in arrival order, as the table's
        rows = replay_rows(inside, cached, -math.inf, math.inf)
        on = None if placed_on is None else [placed_on[q.id] for q in inside]
        table = whatif.RequestTable(rows, block_size, model, degrees, on)
        if anywhere:
            table = whatif.cached_before_anywhere(table)
        variant = None
        if ancestors:
            levels = ancestor_levels(rows, block_size)
            variant = partial(ancestors_replay, levels=levels, lengths=[r[1] for r in rows])
        if inherit is None:
            found = [whatif.estimate(table, c, params) for c in comps]
        else:
            heirs, paths = inherit
            at = whatif.holder_rows(table.held_before(), heirs.workers)
            found = [
                whatif.estimate(
                    table, c, params, held=whatif.holders_on(at, heirs.after(p)), variant=variant
                )
                if p is not None
                else whatif.Estimate(c, math.nan, math.nan, table.n)
                for c, p in zip(comps, paths, strict=True)
            ]
        first = found[0]
        gains.append([[1.0 - e.mean_s / first.mean_s, 1.0 - e.p90_s / first.p90_s] for e in found])
    return np.array(gains).reshape(-1, len(comps), 2)


def held_paths(
    comps: list[Composition], degrees: list[int]
) -> tuple[probes.Heirs, list[list[planner.PathStep] | None]]:
    """Where the first composition's cached prefixes go on each composition: its
    layout's :class:`~vertumnus.core.probes.Heirs`, and per composition the path of
    splits or merges :func:`~vertumnus.core.planner.free_path` walks to it, whole (not
    cut at ``max_walk`` as the check's probes are, so that a far composition is
    estimated too; none for the first; None where no path of one direction leads
    there)."""
    layout = planner.layout_for(comps[0])
    settings = planner.PlannerSettings(degrees=tuple(degrees))
    idle = [planner.WorkerObservation(s.worker, 0.0, 0.0) for s in layout.slots]
    paths: list[list[planner.PathStep] | None] = [[]]
    for c in comps[1:]:
        direction = "split" if c.workers > comps[0].workers else "merge"
        path = planner.free_path(layout, (), direction, settings, idle, target=c)
        paths.append(path if path and path[-1].composition == c else None)
    return probes.Heirs(layout), paths


def decompose(
    requests: list[Request],
    got: Comparison,
    block_size: int,
    comps: list[Composition],
    params: PlacementParams,
    skip_s: float,
    window_s: float | None,
    placed_on: dict[int, int] | None = None,
) -> list[dict[str, dict[str, float]] | None]:
    """Per composition, what a scored request's TTFT is made of in the simulator and in
    the replay (window by window with ``window_s``, as :func:`windows` cuts them, else
    the whole stretch): the mean wait, prefill time and reused tokens per request, over
    the requests the replay served, and in the replay the share of requests with a
    prefix to reuse that reused it (they reuse it whole, or not at all). ``placed_on``:
    the replays start where the first composition's pool held the prefixes, as
    :func:`window_gains`' (``--cached-before held``; None for a composition no
    one-way path leads to)."""
    model = load_model()
    degrees = sorted({d for c in comps for d in c.degrees})
    inherit = None if placed_on is None else held_paths(comps, degrees)
    if window_s is None:
        spans = [sorted((q for q in requests if q.arrival_s >= skip_s), key=lambda q: q.arrival_s)]
    else:
        spans = list(windows(requests, skip_s, window_s))
    # Per composition: (request id, wait, prefill, reused tokens, reused or None if
    # it had no prefix to reuse) of each request the replay served.
    served: list[list[tuple[int, float, float, int, bool | None]]] = [[] for _ in comps]
    for inside in spans:
        rows = replay_rows(inside, got.cached, -math.inf, math.inf)
        on = None if placed_on is None else [placed_on[q.id] for q in inside]
        table = whatif.RequestTable(rows, block_size, model, degrees, on)
        for i, (comp, out) in enumerate(zip(comps, served, strict=True)):
            held = None
            if inherit is not None:
                heirs, paths = inherit
                path = paths[i]
                if path is None:
                    continue  # no one-way path there: nothing to decompose
                at = whatif.holder_rows(table.held_before(), heirs.workers)
                held = whatif.holders_on(at, heirs.after(path))
            record: list[tuple[float, float, bool]] = []
            variant = partial(whatif.replay_py, record=record)
            whatif.estimate(table, comp, params, variant=variant, held=held)
            # Arrival order: the table's, and so the record's.
            for q, row, (wait, prefill, hit) in zip(inside, rows, record, strict=True):
                if not math.isnan(wait):
                    reused = row[2] if hit else 0
                    out.append((q.id, wait, prefill, reused, hit if row[2] > 0 else None))
    parts: list[dict[str, dict[str, float]] | None] = []
    for i, replayed in enumerate(served):
        if not replayed:
            parts.append(None)
            continue
        # The simulator's side over the same requests.
        sim = [got.served[i][r[0]] for r in replayed]
        hits = [r[4] for r in replayed if r[4] is not None]
        parts.append(
            {
                "simulator": {
                    "wait_s": float(np.mean([w for w, _, _ in sim])),
                    "prefill_s": float(np.mean([p for _, p, _ in sim])),
                    "reused_tokens": float(np.mean([r for _, _, r in sim])),
                },
                "replay": {
                    "wait_s": float(np.mean([r[1] for r in replayed])),
                    "prefill_s": float(np.mean([r[2] for r in replayed])),
                    "reused_tokens": float(np.mean([r[3] for r in replayed])),
                    "reused_share": float(np.mean(hits)) if hits else 0.0,
                },
            }
        )
    return parts


def _warm(gains: np.ndarray | None, i: int, which: int, how: str | None) -> str:
    """The ``--cached-before`` windows' gain of composition ``i`` (mean TTFT: ``which``
    0, P90: 1), to follow the cold windows' on their line ("" without it)."""
    if gains is None or not len(gains):
        return ""
    col = gains[:, i, which]
    if np.isnan(col).all():
        return f"   cached before, {how}: n/a"
    return f"   cached before, {how}: mean {col.mean():+.1%}, sd {col.std():.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", help="a trace spec, as `vertumnus simulate --trace` takes")
    ap.add_argument("--family", choices=sorted(families.FAMILIES))
    ap.add_argument("--load", choices=sorted(families.LOADS))
    ap.add_argument("--draw", type=int, help="the family cell's draw (scored after its warm-up)")
    ap.add_argument(
        "--gpus",
        type=int,
        default=families.GPUS,
        help=f"with --family: the pool the cell's rate is scaled to (default {families.GPUS}; "
        "--compositions must be of as many GPUs)",
    )
    ap.add_argument(
        "--spread",
        choices=families.SPREADS,
        default="populations",
        help="with --gpus over the family's: more users (populations, the default) or the same "
        "ones faster (compress, the figures before 2026-12-07)",
    )
    ap.add_argument("--phases", help="with --trace: reshape it, as `vertumnus simulate --phases`")
    ap.add_argument("--seed", type=int, default=0, help="the seed of --phases (default 0)")
    ap.add_argument(
        "--windows", type=float, metavar="SECONDS", help="also the replay window by window"
    )
    ap.add_argument("--compositions", default="10xCP4,8xCP4+1xCP8")
    ap.add_argument("--skip-s", type=float, default=225.0, help="score from here on (default 225)")
    ap.add_argument(
        "--no-reuse", type=float, metavar="SCALE", help="unique block keys, arrivals ×SCALE"
    )
    ap.add_argument("--beta-busy", type=float, default=PlacementParams().beta_busy)
    ap.add_argument(
        "--decompose",
        action="store_true",
        help="also each composition's wait, prefill time and reuse per request, in the "
        "simulator and in the replay (window by window with --windows)",
    )
    ap.add_argument(
        "--ties",
        choices=("first",),
        help="first: also the replay with placement's former tie-break (the first idle worker)",
    )
    ap.add_argument(
        "--ancestors",
        action="store_true",
        help="with --cached-before held: also those windows replayed with ancestor reuse and "
        "no bound on a prefix's holders (a variant of the replay, to measure)",
    )
    ap.add_argument(
        "--cached-before",
        choices=("anywhere", "held"),
        help="with --windows: also the window replays with every prefix cached before the "
        "window held by every worker at its first reuse (anywhere), or where the first "
        "composition's pool held it, carried along the path to each other one (held; the "
        "shipped replay starts cold)",
    )
    args = ap.parse_args(argv)
    try:
        comps = [Composition.parse(c) for c in args.compositions.split(",")]
        params = PlacementParams(beta_busy=args.beta_busy)
    except ValueError as e:
        ap.error(str(e))
    if args.no_reuse is not None and args.no_reuse <= 0:
        ap.error(f"--no-reuse wants a positive scale, got {args.no_reuse}")
    if args.windows is not None and args.windows <= 0:
        ap.error(f"--windows wants a positive length in seconds, got {args.windows}")
    if args.gpus < 1:
        ap.error(f"--gpus wants a positive count, got {args.gpus}")
    if args.family and any(c.gpus != args.gpus for c in comps):
        ap.error(f"--compositions must each be of --gpus {args.gpus} GPUs, got {args.compositions}")
    if args.cached_before and not args.windows:
        ap.error("--cached-before changes the window replays; give --windows too")
    if args.ancestors and args.cached_before != "held":
        ap.error("--ancestors varies the held window replays; give --cached-before held too")
    if args.phases and not args.trace:
        ap.error("--phases reshapes --trace; give --trace too")
    trace, skip = _stream(args)
    requests = list(trace.requests)
    if args.no_reuse is not None:
        requests = without_reuse(requests, args.no_reuse)
        skip *= args.no_reuse
    got = compare(requests, trace.block_size, comps, params, skip, args.ties == "first")
    print(f"{got.requests} requests scored from {skip:g} s; TTFT without T_ext")
    columns = [("simulator", got.sim_s), ("replay", got.replay_s)]
    if got.first_idle_s:
        columns.append(("first-idle replay", got.first_idle_s))
    for i, comp in enumerate(comps):
        line = "   ".join(f"{name} {v[i]:.4f} s ({v[i] / v[0] - 1:+.1%})" for name, v in columns)
        print(f"  {str(comp):<16} {line}")
    if args.windows:
        gains = window_gains(
            requests, got.cached, trace.block_size, comps, params, skip, args.windows
        )
        warm = None
        if args.cached_before:
            warm = window_gains(
                requests, got.cached, trace.block_size, comps, params, skip, args.windows,
                anywhere=args.cached_before == "anywhere",
                placed_on=got.workers if args.cached_before == "held" else None,
            )  # fmt: skip
        variant = None
        if args.ancestors:
            variant = window_gains(
                requests, got.cached, trace.block_size, comps, params, skip, args.windows,
                placed_on=got.workers, ancestors=True,
            )  # fmt: skip
        print(
            f"{len(gains)} windows of {args.windows:g} s replayed one by one; gain over the first:"
        )
        for i, comp in enumerate(comps[1:], start=1) if len(gains) else ():
            sim_gain = 1.0 - got.sim_s[i] / got.sim_s[0]
            sim_p90 = 1.0 - got.sim_p90_s[i] / got.sim_p90_s[0]
            print(
                f"  {str(comp):<16} mean TTFT: simulator, whole {sim_gain:+.1%}   windows: mean "
                f"{gains[:, i, 0].mean():+.1%}, sd {gains[:, i, 0].std():.1%}"
                + _warm(warm, i, 0, args.cached_before)
                + _warm(variant, i, 0, "held, ancestors")
                + f"\n  {'':<16} P90 TTFT:  simulator, whole {sim_p90:+.1%}   windows: mean "
                f"{gains[:, i, 1].mean():+.1%}, sd {gains[:, i, 1].std():.1%}"
                + _warm(warm, i, 1, args.cached_before)
                + _warm(variant, i, 1, "held, ancestors")
            )
    if args.decompose:
        how = f"windows of {args.windows:g} s" if args.windows else "the whole stretch"
        held = args.cached_before == "held" and args.windows
        for placed_on in (None, got.workers) if held else (None,):
            start = "" if placed_on is None else ", from the first composition's pool's cache"
            print(f"per scored request (replay: {how}{start}): wait, prefill, reused tokens")
            parts = decompose(
                requests, got, trace.block_size, comps, params, skip, args.windows, placed_on
            )
            for comp, part in zip(comps, parts, strict=True):
                if part is None:
                    print(f"  {str(comp):<16} n/a")
                    continue
                sim, rep = part["simulator"], part["replay"]
                print(
                    f"  {str(comp):<16} simulator {1e3 * sim['wait_s']:6.1f} ms "
                    f"{1e3 * sim['prefill_s']:6.1f} ms {sim['reused_tokens']:7.0f}   "
                    f"replay {1e3 * rep['wait_s']:6.1f} ms {1e3 * rep['prefill_s']:6.1f} ms "
                    f"{rep['reused_tokens']:7.0f} (reused by {rep['reused_share']:.0%} of those "
                    "with a prefix)"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
