"""Where a fixed composition's P90 TTFT comes from: which degree serves the long requests, and how fast (issue 12).

Above 40 GPUs the lattice of a family cell often has two valleys on the P90:
the all-CP4 end and a CP8-heavy middle, with a ridge between them where a few
CP8 workers serve beside many CP4 ones (docs/benchmarks/adaptive.md, "The P90's
ridge is placement's"). This command serves one cell's stream
(``bench/families.py``'s workload, one copy) on the compositions given, with
the cost-model placement at each ``--lam`` (λ, the charge for a larger
worker's extra GPUs; 0.1 is the default) and ``--beta-busy`` (β once every
candidate has a queue; 10 is the default), and prints per composition: the
mean and P90 TTFT of the scored requests, per degree the share of the
requests it served, the share of long ones among them (over
``PlannerSettings.long_threshold``, 32K tokens), their mean TTFT and how much
of it they waited (the TTFT less the model's prefill time and T_ext), and the
share of long requests in the slowest tenth.

    python bench/p90_anatomy.py --family longcontext --load moderate \\
        --compositions 10xCP4,8xCP4+1xCP8,4xCP4+3xCP8 --lam 0.1,0.3   # ~1 min
    python bench/p90_anatomy.py --family longcontext --load moderate --gpus 256 \\
        --compositions 18xCP4+23xCP8,48xCP4+8xCP8,64xCP4               # ~3 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402  (the workload families and their cells)

from vertumnus.core.costmodel import PrefillModel  # noqa: E402
from vertumnus.core.metrics import Completion  # noqa: E402
from vertumnus.core.placement import PlacementParams  # noqa: E402
from vertumnus.core.plannersettings import PlannerSettings  # noqa: E402
from vertumnus.core.policies.vertumnus import CostModelPolicy  # noqa: E402
from vertumnus.core.types import Composition  # noqa: E402
from vertumnus.profiles import load_model  # noqa: E402
from vertumnus.sim.engine import PoolConfig, Simulation  # noqa: E402


def anatomy(
    completions: list[Completion], long_tokens: int, model: PrefillModel, t_ext_s: float
) -> dict[str, Any]:
    """The scored requests' mean and P90 TTFT, per degree who it served and how
    fast (the long requests' TTFT and its wait: the TTFT less the prefill time
    the model gives and T_ext), and how many of the slowest tenth are long."""
    ttft = np.array([c.ttft_s for c in completions])
    prefill = [
        model.predict(c.degree, c.length - c.cached_tokens, c.cached_tokens) for c in completions
    ]
    wait = ttft - t_ext_s - np.array(prefill)
    long = np.array([c.length > long_tokens for c in completions])
    degree = np.array([c.degree for c in completions])
    p90 = float(np.percentile(ttft, 90))
    per_degree = {}
    for d in sorted(set(degree.tolist())):
        here = degree == d
        long_here = here & long
        per_degree[f"CP{d}"] = {
            "share": float(here.mean()),
            "long_share": float(long[here].mean()),
            "long_mean_ttft_s": float(ttft[long_here].mean()) if long_here.any() else None,
            "long_mean_wait_s": float(wait[long_here].mean()) if long_here.any() else None,
        }
    return {
        "mean_ttft_s": float(ttft.mean()),
        "p90_ttft_s": p90,
        "long_share": float(long.mean()),
        "slowest_tenth_long_share": float(long[ttft >= p90].mean()),
        "per_degree": per_degree,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--family", required=True, choices=sorted(families.FAMILIES))
    ap.add_argument("--load", required=True, choices=sorted(families.LOADS))
    ap.add_argument("--gpus", type=int, default=families.GPUS)
    ap.add_argument("--draw", type=int, default=0)
    ap.add_argument(
        "--compositions", required=True, help="comma-separated, e.g. 10xCP4,4xCP4+3xCP8"
    )
    ap.add_argument("--lam", default=str(PlacementParams().lam), help="comma-separated λ values")
    ap.add_argument(
        "--beta-busy",
        type=float,
        default=PlacementParams().beta_busy,
        help="β when every candidate has requests waiting (placement's beta_busy)",
    )
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    try:
        comps = [Composition.parse(c) for c in args.compositions.split(",") if c.strip()]
        lams = [float(x) for x in args.lam.split(",") if x.strip()]
    except ValueError as e:
        ap.error(str(e))
    if any(c.gpus != args.gpus for c in comps):
        ap.error(f"every composition must have {args.gpus} GPUs (--gpus)")
    if not comps or not lams or any(x < 0 for x in lams):
        ap.error("give at least one composition and λ values >= 0")
    if args.beta_busy < PlacementParams().beta:
        ap.error(f"--beta-busy must be >= {PlacementParams().beta}, got {args.beta_busy}")
    trace, _ = families.workload(args.family, args.load, args.draw, args.gpus)
    model = load_model()
    long_tokens = PlannerSettings().long_threshold
    rows = []
    for comp in comps:
        for lam in lams:
            params = PlacementParams(lam=lam, beta_busy=args.beta_busy)
            sim = Simulation(
                PoolConfig(comp, model, block_size=trace.block_size), CostModelPolicy(params)
            )
            done = families.scored(sim.run(trace.requests).completions, args.draw)
            got = anatomy(done, long_tokens, model, sim.pool.t_ext_s)
            rows.append({"composition": str(comp), "lam": lam, "beta_busy": args.beta_busy, **got})
            degrees = ", ".join(
                f"{d} {v['share']:.1%} of requests ({v['long_share']:.0%} long"
                + (
                    f", at {v['long_mean_ttft_s']:.3f} s, {v['long_mean_wait_s']:.3f} s of it waiting"
                    if v["long_mean_ttft_s"] is not None
                    else ""
                )
                + ")"
                for d, v in got["per_degree"].items()
            )
            print(
                f"{comp} λ={lam:g}: mean {got['mean_ttft_s']:.4f} s, P90 {got['p90_ttft_s']:.4f} s; "
                f"{degrees}; slowest tenth {got['slowest_tenth_long_share']:.0%} long",
                flush=True,
            )
    if args.json:
        out = {
            "command": "python bench/p90_anatomy.py " + " ".join(argv or sys.argv[1:]),
            "family": args.family,
            "load": args.load,
            "gpus": args.gpus,
            "draw": args.draw,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
