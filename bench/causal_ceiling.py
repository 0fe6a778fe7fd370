"""What a controller that knew every composition's TTFTs up to now could meet (issue 12).

A family cell's adaptive pool is judged against the best fixed composition of the
stretch, chosen in hindsight. This command asks how much of that bar is reachable
without hindsight: every lattice composition serves the cell's stream as a fixed
pool (the simulator), and a *causal* controller, every 20 s from the end of the
warm-up, takes the composition whose pool served the requests of the last
``--horizon`` seconds best (pooled: their mean and P90 weighed by ``--weight``, each
against the best of them). The requests of the next 20 s get that composition's
TTFTs, spliced from its fixed run: its counterfactuals are exact and its moves
free (no drain, no switch, no cold cache), so it is an upper bound of any
controller that decides on the past, not a controller. Printed per policy: its
mean and P90 against the best fixed composition's, and its moves.

    python bench/causal_ceiling.py --family mooncake --load light --draw 2
    python bench/causal_ceiling.py --family mooncake --load moderate --draw 0 \\
        --horizon 225,600,inf --weight 0,0.5,1

~1 min per light cell on 2 cores (one simulation per lattice point).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402  (the workload families and their cells)

from vertumnus.core import planner  # noqa: E402
from vertumnus.core.policies.vertumnus import CostModelPolicy  # noqa: E402
from vertumnus.profiles import load_model  # noqa: E402
from vertumnus.sim.engine import PoolConfig, Simulation  # noqa: E402

STEP_S = 20.0
"""How often the causal controller chooses (the controller's window)."""


def fixed_ttfts(trace, lattice) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Arrivals in order, and per composition its fixed pool's TTFT of each request."""
    model = load_model()
    ordered = sorted(trace.requests, key=lambda q: q.arrival_s)
    arrivals = np.array([q.arrival_s for q in ordered])
    out = {}
    for comp in lattice:
        pool = PoolConfig(comp, model, block_size=trace.block_size)
        run = Simulation(pool, CostModelPolicy()).run(trace.requests)
        ttft = {c.request_id: c.ttft_s for c in run.completions}
        out[str(comp)] = np.array([ttft[q.id] for q in ordered])
    return arrivals, out


def causal(
    arrivals: np.ndarray, ttfts: dict[str, np.ndarray], start_s: float, horizon_s: float, w: float
) -> tuple[np.ndarray, list[str]]:
    """The scored requests' TTFTs under the causal controller (module docstring), and
    its choice at each step."""
    names = list(ttfts)
    scored = np.flatnonzero(arrivals >= start_s)
    out = np.empty(len(scored))
    choices = []
    t = start_s
    while t <= arrivals[-1]:
        past = (arrivals < t) & (arrivals >= t - horizon_s)
        stats = {n: (ttfts[n][past].mean(), np.percentile(ttfts[n][past], 90)) for n in names}
        best_mean = min(m for m, _ in stats.values())
        best_p90 = min(p for _, p in stats.values())
        chosen = min(
            names, key=lambda n: (1 - w) * stats[n][0] / best_mean + w * stats[n][1] / best_p90
        )
        choices.append(chosen)
        step = (arrivals[scored] >= t) & (arrivals[scored] < t + STEP_S)
        out[step] = ttfts[chosen][scored[step]]
        t += STEP_S
    return out, choices


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"want numbers separated by commas, got {text!r}") from e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--family", required=True, choices=sorted(families.FAMILIES))
    ap.add_argument("--load", required=True, choices=sorted(families.LOADS))
    ap.add_argument("--draw", type=int, default=0)
    ap.add_argument("--replica", type=int, default=0, help="copy of the stream (default 0)")
    ap.add_argument("--horizon", type=_floats, default=[225.0, 600.0, math.inf])
    ap.add_argument("--weight", type=_floats, default=[0.0, 0.5, 1.0], help="of the P90")
    args = ap.parse_args(argv)
    if any(h <= 0 for h in args.horizon) or any(not 0 <= w <= 1 for w in args.weight):
        ap.error("horizons must be > 0 and weights in [0, 1]")
    trace, _ = families.workload(args.family, args.load, args.draw)
    trace = families.replica(trace, args.replica)
    lattice = planner.enumerate_lattice(families.GPUS, (4, 8), 8)
    arrivals, ttfts = fixed_ttfts(trace, lattice)
    start = families.WARMUP_S
    scored = arrivals >= start
    best_mean = min(v[scored].mean() for v in ttfts.values())
    best_p90 = min(np.percentile(v[scored], 90) for v in ttfts.values())

    def line(v: np.ndarray) -> str:
        m, p = v.mean() / best_mean, np.percentile(v, 90) / best_p90
        return f"{m:.4f} {p:.4f}{'  within 1 %' if max(m, p) <= 1.01 else ''}"

    print(f"{args.family} {args.load} draw {args.draw} copy {args.replica}: mean, P90 / best fixed")
    for name, v in ttfts.items():
        print(f"  fixed {name:<14} {line(v[scored])}")
    for h in args.horizon:
        for w in args.weight:
            v, choices = causal(arrivals, ttfts, start, h, w)
            moves = sum(a != b for a, b in zip(choices, choices[1:], strict=False))
            print(f"  causal, horizon {h:g} s, P90 weight {w:g}: {line(v)}  ({moves} moves)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
