"""Policy-core speed: placement decisions per second on a large pool (issue 4).

    python bench/placement_speed.py [--workers 64] [--blocks 1000000] [--decisions 20000]
                                    [--inflight-per-worker 3] [--repeat 5]
                                    [--out docs/benchmarks/placement_speed.json] [--profile]

Builds, in the pure core only, a :class:`~vertumnus.core.trie.PrefixTrie` of
``--blocks`` cached blocks spread over ``--workers`` workers (16 each of CP1,
CP2, CP4, CP8 for 64) behind a :class:`~vertumnus.core.routing.RoutingCore`
(what the router and the simulator run), then times, one request at a time
on one core:

``decide``
    the full ``CostModelPolicy.decide`` path — prefix-trie lookup, in-flight
    index lookup and merge, ``place()`` — with ``--inflight-per-worker`` ×
    workers requests in flight.
``schedule``
    the routing core's whole placement step, ``RoutingCore.schedule``: q_w
    refreshed for every worker, ``decide``, the reservation, the in-flight
    record and the policy's ``observe_placed`` — what the router does per
    request. After it, the oldest request in flight starts and finishes
    (``started`` + ``finished``), so the in-flight set stays at a steady
    size; that is timed separately as ``bookkeeping``.
``place``
    ``place()`` alone, on the trie's matches for the same requests.
``trie``
    ``PrefixTrie.matched_blocks`` alone.
``decide-py`` / ``place-py``
    the same two with the pure-Python ``place_fields_py`` in place of the
    compiled hot path (``vertumnus.core._placement``), for the ratio between
    them in one run (absent when the build has no C extension).

Each path reports decisions/s and the p50 / p99 / max latency of one call, by
the thread's CPU clock (the cost on one core, unaffected by other jobs on a
shared machine) and by the wall clock: the **median over ``--repeat``
passes** of each figure (all passes are in the JSON).

The trie has the shape a long-context pool produces: a few hot system
prompts cached on many workers, and many conversation prefixes (40–60 blocks)
cached on one to three workers each. Requests extend a random cached prefix
by 1–20 new blocks (1 % are long documents of 160–250 blocks), so a decision
walks ~45 blocks and meets 1–40 holders. ``--profile`` prints the top of a
cProfile of the ``decide`` loop.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from vertumnus.core import placement
from vertumnus.core.placement import PlacementParams, place_fields_py
from vertumnus.core.policies import vertumnus as vertumnus_policy
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.routing import RoutingCore
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Request
from vertumnus.profiles import load_model

BLOCK = 512


def build(n_workers: int, n_blocks: int, seed: int) -> tuple[RoutingCore, list[tuple[int, ...]]]:
    rng = random.Random(seed)
    degrees = [1, 2, 4, 8]
    trie = PrefixTrie()
    next_key = iter(range(1, 1 << 62))
    prefixes: list[tuple[int, ...]] = []
    # Hot system prompts: 8 prompts of 4 blocks, each cached on ~half the pool.
    systems = []
    for _ in range(8):
        keys = tuple(next(next_key) for _ in range(4))
        holders = rng.sample(range(n_workers), n_workers // 2)
        for w in holders:
            trie.apply(w, chain(keys))
        systems.append((keys, holders))
    total = len(trie)
    while total < n_blocks:
        sys_keys, sys_holders = systems[rng.randrange(len(systems))]
        n = rng.randint(40, 60)
        keys = sys_keys + tuple(next(next_key) for _ in range(n))
        for w in rng.sample(sys_holders, rng.randint(1, 3)):
            trie.apply(w, chain(keys))
        prefixes.append(keys)
        total = len(trie)
    core = RoutingCore(CostModelPolicy(), load_model(), BLOCK, store=trie)
    for i in range(n_workers):
        core.add_worker(i, degrees[i % 4], cache_capacity_blocks=4000)
    return core, prefixes


def chain(keys: tuple[int, ...]) -> list[tuple[int, int, int | None]]:
    """The stored events of a whole prefix: (key, position, parent)."""
    return [(k, i, keys[i - 1] if i else None) for i, k in enumerate(keys)]


def make_requests(
    prefixes: list[tuple[int, ...]], n: int, seed: int, first_id: int = 0
) -> list[Request]:
    rng = random.Random(seed)
    out = []
    fresh = iter(range(1 << 62, 1 << 63))
    for i in range(first_id, first_id + n):
        base = prefixes[rng.randrange(len(prefixes))]
        cut = rng.randint(1, len(base))
        extra = rng.randint(160, 250) if rng.random() < 0.01 else rng.randint(1, 20)
        keys = base[:cut] + tuple(next(fresh) for _ in range(extra))
        out.append(Request(i, 0.0, len(keys) * BLOCK - rng.randrange(BLOCK), keys))
    return out


Clock = Callable[[], int]


def time_decide(
    core: RoutingCore, requests: list[Request], warm: list[Request], per_worker: int, clock: Clock
) -> tuple[list[int], list[int], list[int]]:
    """Latencies of ``decide``, of ``schedule`` (the whole step) and of the bookkeeping
    after it, on a routing core that holds ``per_worker`` × workers requests (``warm``)."""
    limit = per_worker * len(core.workers)
    flight: deque[int] = deque()

    def settle() -> None:
        # The oldest request in flight runs and finishes: a steady in-flight set.
        while len(flight) > limit:
            rid = flight.popleft()
            core.started(rid, 0.0, 0.0)
            core.finished(rid)

    for r in warm[:limit]:
        assert core.schedule(r, 0.0) is not None
        flight.append(r.id)
    policy = core.policy
    lat, step, booking = [], [], []
    for r in requests:
        t0 = clock()
        d = policy.decide(r, core)
        t1 = clock()
        assert d is not None
        core.schedule(r, 0.0)
        t2 = clock()
        flight.append(r.id)
        settle()
        t3 = clock()
        lat.append(t1 - t0)
        step.append(t2 - t1)
        booking.append(t3 - t2)
    assert len(core.inflight) == limit  # steady state: one finishes per one placed
    while flight:  # leave the core as it was
        rid = flight.popleft()
        core.started(rid, 0.0, 0.0)
        core.finished(rid)
    return lat, step, booking


def time_place(pool: RoutingCore, requests: list[Request], clock: Clock, fn=None) -> list[int]:
    fn = fn or placement.place_fields
    params = PlacementParams()
    workers, model, bs = pool.workers, pool.model, pool.block_size
    inputs = [(r.length, dict(pool.matched_blocks(r))) for r in requests]
    lat = []
    for length, matched in inputs:
        t0 = clock()
        fn(length, matched, workers, model, params, bs)
        lat.append(clock() - t0)
    return lat


def time_decide_py(*args) -> tuple[list[int], list[int], list[int]]:
    """time_decide with the policy running the pure-Python place_fields."""
    compiled = vertumnus_policy.place_fields
    vertumnus_policy.place_fields = place_fields_py
    try:
        return time_decide(*args)
    finally:
        vertumnus_policy.place_fields = compiled


def time_trie(pool: RoutingCore, requests: list[Request], clock: Clock) -> list[int]:
    lat = []
    for r in requests:
        t0 = clock()
        pool.matched_blocks(r)
        lat.append(clock() - t0)
    return lat


def summary(lat_ns: list[int]) -> dict[str, float]:
    lat = sorted(lat_ns)
    return {
        "decisions_per_s": len(lat) / (sum(lat) / 1e9),
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
        "max_us": lat[-1] / 1e3,
    }


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--decisions", type=int, default=20_000)
    ap.add_argument("--inflight-per-worker", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    pool, prefixes = build(args.workers, args.blocks, args.seed)
    build_s = time.perf_counter() - t0
    requests = make_requests(prefixes, args.decisions, args.seed + 1)
    # Requests in flight when timing starts; their own ids, as the in-flight
    # index treats a known id as the same request moving to another worker.
    warm = make_requests(
        prefixes,
        args.inflight_per_worker * args.workers + 1000,
        args.seed + 2,
        first_id=len(requests),
    )
    blocks = statistics.mean(len(r.block_keys) for r in requests)
    print(f"hot path: {placement.HOT_PATH}")
    print(
        f"trie: {len(pool.store):,} blocks over {args.workers} workers (built in {build_s:.1f} s); "
        f"requests: {len(requests):,}, {blocks:.1f} blocks each on average; "
        f"{args.inflight_per_worker * args.workers} in flight"
    )

    # The decisions' own cost: what the bench built is moved out of the cyclic
    # GC's generations, so that no full collection lands in some decision's
    # time. The index itself is outside them already (its compiled node, see
    # vertumnus.core.trie.UNTRACKED); without that node a full collection walks
    # two objects per block, ~0.3 s at a million (bench/gc_pause.py).
    gc.collect()
    gc.freeze()
    time_decide(pool, warm[-1000:], warm, args.inflight_per_worker, time.perf_counter_ns)  # warm-up
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        time_decide(pool, requests, warm, args.inflight_per_worker, time.perf_counter_ns)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    # Two clocks: on-CPU time of this thread (what a call costs on one core;
    # immune to other jobs preempting us on a shared machine) and wall time.
    # Passes interleave the paths so that a burst of load elsewhere on the
    # machine does not land on one path only; each figure is the median.
    paths: tuple[str, ...] = ("decide", "schedule", "bookkeeping", "place", "trie")
    if placement.HOT_PATH == "c":
        paths += ("decide-py", "place-py")
    passes: dict[str, dict[str, list[dict[str, float]]]] = {
        p: {"cpu": [], "wall": []} for p in paths
    }
    for _ in range(args.repeat):
        for label, clock in (("cpu", time.thread_time_ns), ("wall", time.perf_counter_ns)):
            lat, step, booking = time_decide(pool, requests, warm, args.inflight_per_worker, clock)
            passes["decide"][label].append(summary(lat))
            passes["schedule"][label].append(summary(step))
            passes["bookkeeping"][label].append(summary(booking))
            passes["place"][label].append(summary(time_place(pool, requests, clock)))
            passes["trie"][label].append(summary(time_trie(pool, requests, clock)))
            if "decide-py" in paths:
                lat, _, _ = time_decide_py(pool, requests, warm, args.inflight_per_worker, clock)
                passes["decide-py"][label].append(summary(lat))
                passes["place-py"][label].append(
                    summary(time_place(pool, requests, clock, place_fields_py))
                )
    figures = {p: {label: median_of(runs) for label, runs in passes[p].items()} for p in paths}
    for p in paths:
        for label in ("cpu", "wall"):
            f = figures[p][label]
            print(
                f"{p:11s} {label:4s} clock: {f['decisions_per_s']:9,.0f} /s   p50 {f['p50_us']:6.1f} µs   "
                f"p99 {f['p99_us']:6.1f} µs   max {f['max_us']:7.1f} µs"
            )
    if "decide-py" in paths:
        for p in ("decide", "place"):
            ratio = (
                figures[p]["cpu"]["decisions_per_s"] / figures[p + "-py"]["cpu"]["decisions_per_s"]
            )
            print(f"{p}: compiled / Python hot path = {ratio:.2f}x decisions/s (CPU clock)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "workers": args.workers,
                    "trie_blocks": len(pool.store),
                    "decisions": len(requests),
                    "mean_request_blocks": blocks,
                    "inflight_requests": args.inflight_per_worker * args.workers,
                    "repeat": args.repeat,
                    "statistic": "median over passes",
                    # The full decide path, as before (top level, for existing readers).
                    "cpu_clock": figures["decide"]["cpu"],
                    "wall_clock": figures["decide"]["wall"],
                    "paths": {
                        p: {
                            "cpu_clock": figures[p]["cpu"],
                            "wall_clock": figures[p]["wall"],
                            "passes": passes[p],
                        }
                        for p in paths
                    },
                    "python": sys.version.split()[0],
                    "hot_path": placement.HOT_PATH,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
