"""What the shadow pools cost: per request they serve, and per comparison (issue 12).

A shadow (:class:`vertumnus.core.shadow.Shadow`) places every request the pool
serves. Its search costs a few candidate workers per request (the soonest free
of each degree and the holders of the longest prefixes); a scan costs every
worker. This serves ``--seconds`` of the built-in synthetic stream at 0.75
requests/s per GPU (``bench/decision_tick.py``'s load) on the compositions
that file times, through one shadow searched and one scanned, checks that they
placed every request alike, and prints CPU µs per request (the scan timed on
the first ``--scan`` requests only: at 1,024 GPUs it costs ~1 ms a request).

The controller follows the current composition and the probes along its split
and merge paths (``probes.ends`` with the default settings): that many
shadows serve each request, which gives the share of a core they take at that
rate. A comparison (:meth:`ShadowBank.compare`, at every window boundary) pools
each shadow's last ``shadow_horizon_s`` of TTFTs against the current one's: it
is timed with that many requests recorded in every shadow (median of
``--repeat``; the values do not matter to its cost).

    python bench/shadow_speed.py [--seconds 20] [--scan 3000] [--repeat 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from vertumnus.core import planner, probes
from vertumnus.core.placement import PlacementParams
from vertumnus.core.shadow import Shadow, ShadowBank
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


def serve(comp: str, requests: list, block_size: int, scan: bool) -> tuple[float, list[float]]:
    """CPU µs per request of one shadow of ``comp`` serving ``requests``, and its TTFTs."""
    c = Composition.parse(comp)
    s = Shadow(c, load_model(), PlacementParams(), 1000, block_size, 0.0, scan=scan)
    t0 = time.process_time()
    for q in requests:
        s.serve(q)
    return (time.process_time() - t0) / len(requests) * 1e6, s.ttfts


def followed(comp: str, degrees: tuple[int, ...]) -> list[Composition]:
    """The compositions the controller keeps shadows of on ``comp``."""
    settings = planner.PlannerSettings(degrees=degrees)
    layout = planner.layout_for(Composition.parse(comp))
    workers = [planner.WorkerObservation(s.worker, 0.0, 0.0) for s in layout.slots]
    paths = probes.ends(layout, workers, settings)
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
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = []
    for gpus, comps in POOLS.items():
        rate = RATE_PER_GPU * gpus
        config = SyntheticConfig(duration_s=args.seconds, mean_rate=rate, peak_to_trough=1.0)
        trace = generate(config, seed=0)
        requests = sorted(trace.requests, key=lambda q: q.arrival_s)
        for comp, degrees in comps:
            searched, ttfts = serve(comp, requests, trace.block_size, scan=False)
            head = requests[: args.scan]
            scanned, reference = serve(comp, head, trace.block_size, scan=True)
            if ttfts[: len(reference)] != reference:
                raise SystemExit(f"{comp}: the search placed a request unlike the scan")
            shadows = followed(comp, degrees)
            horizon = int(rate * planner.PlannerSettings().shadow_horizon_s)
            compared = compare_ms(shadows, horizon, args.repeat)
            share = searched * 1e-6 * rate * len(shadows)
            row = {
                "gpus": gpus,
                "composition": comp,
                "requests": len(requests),
                "rate_per_s": rate,
                "search_us": round(searched, 1),
                "scan_us": round(scanned, 1),
                "scan_over_search": round(scanned / searched, 2),
                "shadows": len(shadows),
                "core_share": round(share, 3),
                "horizon_requests": horizon,
                "compare_ms": round(compared, 1),
                "mean_ttft_s": round(float(np.mean(ttfts)), 4),
            }
            rows.append(row)
            print(
                f"{gpus:5d} GPUs {comp:24s}: a request {searched:6.1f} µs searched, "
                f"{scanned:7.1f} µs scanned ({scanned / searched:4.1f}x); {len(shadows)} shadows "
                f"take {share:6.1%} of a core; a comparison over {horizon} requests "
                f"{compared:5.1f} ms"
            )
    if args.out:
        out = {
            "date": time.strftime("%Y-%m-%d"),
            "command": "python bench/shadow_speed.py " + " ".join(argv or sys.argv[1:]),
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
