"""What the shadow pools cost: per request they serve, per comparison, and in memory (issue 12).

A shadow (:class:`vertumnus.core.shadow.Shadow`) places every request the pool
serves. Its search costs a few candidate workers per request (the soonest free
of each degree and the holders of the longest prefixes); a scan costs every
worker. This serves ``--seconds`` of the built-in synthetic stream at 0.75
requests/s per GPU (``bench/decision_tick.py``'s load) on the compositions
that file times, through one shadow searched in C (the compiled twin, where the
build has it), one searched in Python and one scanned, checks that they placed
every request alike, and prints CPU µs per request of each (the scan timed on
the first ``--scan`` requests only: at 1,024 GPUs it costs ~1 ms a request).

The controller follows the current composition and the probes along its split
and merge paths (``probes.ends`` with the default settings): that many
shadows serve each request, which gives the share of a core they take at that
rate. A comparison (:meth:`ShadowBank.compare`, at every window boundary) pools
each shadow's last ``shadow_horizon_s`` of TTFTs against the current one's: it
is timed with that many requests recorded in every shadow (median of
``--repeat``; the values do not matter to its cost).

Memory: a 40-GPU shadow with caches of ``--fill-blocks`` blocks per GPU serves
the stream until every cache is full; the bytes it allocated (``tracemalloc``)
per cached block, in C and in Python, and from them the shadows the controller
keeps for a pool of each size caching 512K tokens per GPU.

    python bench/shadow_speed.py [--seconds 20] [--scan 3000] [--repeat 7]
        [--fill-blocks 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from array import array

import numpy as np

from vertumnus.core import planner, probes
from vertumnus.core.placement import PlacementParams
from vertumnus.core.shadow import HOT_PATH, SHADOW_BLOCK_TOKENS, Shadow, ShadowBank
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.synthetic import SyntheticConfig, generate

POOLS = {
    40: (("6xCP4+2xCP8", (4, 8)),),
    256: (("32xCP4+16xCP8", (4, 8)),),
    1024: (("128xCP4+64xCP8", (4, 8)), ("512xCP1+128xCP2+64xCP4", (1, 2, 4, 8))),
}
"""GPUs → the compositions timed there (composition, allowed degrees)."""
RATE_PER_GPU = 0.75


def serve(
    comp: str, requests: list, block_size: int, scan: bool, compiled: bool
) -> tuple[float, array]:
    """CPU µs per request of one shadow of ``comp`` serving ``requests``, and its TTFTs."""
    c = Composition.parse(comp)
    s = Shadow(c, load_model(), PlacementParams(), 1000, block_size, 0.0, scan, compiled)
    t0 = time.process_time()
    for q in requests:
        s.serve(q)
    return (time.process_time() - t0) / len(requests) * 1e6, s.ttfts


def bytes_per_block(compiled: bool, blocks_per_gpu: int) -> tuple[float, int]:
    """Bytes a filled 40-GPU shadow allocated per block it caches, and its blocks."""
    config = SyntheticConfig(duration_s=3600.0, mean_rate=30.0, peak_to_trough=1.0)
    trace = generate(config, seed=1)
    c = Composition.parse(POOLS[40][0][0])
    gc.collect()
    tracemalloc.start()
    try:
        s = Shadow(c, load_model(), PlacementParams(), blocks_per_gpu, trace.block_size, 0.0,
                   compiled=compiled)  # fmt: skip
        for q in sorted(trace.requests, key=lambda q: q.arrival_s):
            s.serve(q)
        del s.arrivals[:], s.ttfts[:]  # the records are the comparison's, not the caches'
        gc.collect()
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    blocks = sum(len(s.cached(w)) for w in range(len(s.degrees)))
    if blocks < blocks_per_gpu * c.gpus:
        raise SystemExit(f"the stream filled {blocks} of {blocks_per_gpu * c.gpus} blocks")
    return used / blocks, blocks


def followed(comp: str, degrees: tuple[int, ...]) -> list[Composition]:
    """The compositions the controller keeps shadows of on ``comp``."""
    settings = planner.PlannerSettings(degrees=degrees)
    layout = planner.layout_for(Composition.parse(comp))
    workers = [planner.WorkerObservation(s.worker, 0.0, 0.0) for s in layout.slots]
    paths = probes.ends(probes.walk(layout, workers, settings))
    return [layout.composition, *paths["split"], *paths["merge"]]


def compare_ms(comps: list[Composition], requests: int, repeat: int) -> float:
    """Median CPU ms of one comparison of ``comps`` (the first the current one), each
    shadow holding ``requests`` TTFTs over the horizon."""
    settings = planner.PlannerSettings()
    bank = ShadowBank(load_model(), PlacementParams(), 1000, 512, settings.shadow_horizon_s, 0.0)
    bank.follow(comps)
    rng = np.random.default_rng(0)
    arrivals = np.sort(rng.uniform(0.0, settings.shadow_horizon_s, requests))
    for s in bank.shadows.values():
        s.arrivals.frombytes(arrivals.tobytes())
        s.ttfts.frombytes(rng.lognormal(-1.5, 1.0, requests).tobytes())
    bank.now_s = settings.shadow_horizon_s
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        assert len(bank.compare(comps[0])) == len(comps) - 1
        times.append((time.process_time() - t0) * 1e3)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--scan", type=int, default=3000, help="requests the scan is timed on")
    ap.add_argument("--repeat", type=int, default=7, help="comparisons timed")
    ap.add_argument("--fill-blocks", type=int, default=100, help="cache blocks per GPU, memory")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if min(args.seconds, args.scan, args.repeat, args.fill_blocks) <= 0:
        ap.error("--seconds, --scan, --repeat and --fill-blocks must be > 0")
    ways = ("python", "c") if HOT_PATH == "c" else ("python",)
    rows = []
    for gpus, comps in POOLS.items():
        rate = RATE_PER_GPU * gpus
        config = SyntheticConfig(duration_s=args.seconds, mean_rate=rate, peak_to_trough=1.0)
        trace = generate(config, seed=0)
        requests = sorted(trace.requests, key=lambda q: q.arrival_s)
        for comp, degrees in comps:
            searched = {w: serve(comp, requests, trace.block_size, False, w == "c") for w in ways}
            ttfts = searched["python"][1]
            if any(t != ttfts for _, t in searched.values()):
                raise SystemExit(f"{comp}: the compiled search placed a request unlike Python's")
            head = requests[: args.scan]
            scanned, reference = serve(comp, head, trace.block_size, True, False)
            if ttfts[: len(reference)] != reference:
                raise SystemExit(f"{comp}: the search placed a request unlike the scan")
            shadows = followed(comp, degrees)
            horizon = int(rate * planner.PlannerSettings().shadow_horizon_s)
            compared = compare_ms(shadows, horizon, args.repeat)
            us = searched[ways[-1]][0]
            share = us * 1e-6 * rate * len(shadows)
            row = {
                "gpus": gpus,
                "composition": comp,
                "requests": len(requests),
                "rate_per_s": rate,
                "search_us": round(us, 1),
                "search_python_us": round(searched["python"][0], 1),
                "python_over_search": round(searched["python"][0] / us, 2),
                "scan_us": round(scanned, 1),
                "shadows": len(shadows),
                "core_share": round(share, 3),
                "horizon_requests": horizon,
                "compare_ms": round(compared, 1),
                "mean_ttft_s": round(float(np.mean(ttfts)), 4),
            }
            rows.append(row)
            print(
                f"{gpus:5d} GPUs {comp:24s}: a request {us:5.1f} µs searched ({ways[-1]}), "
                f"{searched['python'][0]:5.1f} µs in Python, {scanned:7.1f} µs scanned; "
                f"{len(shadows)} shadows take {share:6.1%} of a core; a comparison over "
                f"{horizon} requests {compared:5.1f} ms"
            )
    memory = {}
    for way in ways:
        per_block, blocks = bytes_per_block(way == "c", args.fill_blocks)
        # The controller's shadows of a pool of each size, caching 512K tokens per GPU.
        pools = {
            gpus: round(per_block * (512 * 1024 // SHADOW_BLOCK_TOKENS) * gpus * len(
                followed(comps[0][0], comps[0][1])) / 2**20)
            for gpus, comps in POOLS.items()
        }  # fmt: skip
        memory[way] = {"bytes_per_block": round(per_block, 1), "blocks": blocks, "pool_mib": pools}
        print(
            f"memory ({way}): {per_block:5.1f} bytes per cached block ({blocks} blocks); the "
            f"shadows of a pool caching 512K tokens per GPU: "
            + ", ".join(f"{g} GPUs {m} MiB" for g, m in pools.items())
        )
    if args.out:
        out = {
            "date": time.strftime("%Y-%m-%d"),
            "command": "python bench/shadow_speed.py " + " ".join(argv or sys.argv[1:]),
            "hot_path": HOT_PATH,
            "rows": rows,
            "memory": memory,
        }
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
