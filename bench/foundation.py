"""Foundation benchmarks (issue 2): placement policies on the Mooncake trace,
simulator speed and memory, and the fit error of ``vertumnus fit``.

    python bench/foundation.py [--trace PATH] [--scales 6,10] [--out bench-out/foundation.json]

Prints markdown tables ready for docs/benchmarks.md and writes the raw
figures as JSON. Takes ~2 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vertumnus.core.fit import fit_profile, synthesize_profile
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.runner import PolicySpec, RunSettings, run_policy
from vertumnus.sim.traces import load_trace, scale_rate

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
POLICIES = ("vertumnus", "round-robin", "least-work", "length-only", "cache-first")
POOL = "4xCP4+3xCP8"


def compare(trace_path: str, scales: list[float]) -> dict:
    model = load_model()
    trace = load_trace(trace_path)
    out: dict = {}
    for scale in scales:
        t = scale_rate(trace, scale)
        rows = {}
        for kind in POLICIES:
            run = run_policy(PolicySpec(kind, Composition.parse(POOL)), t, RunSettings(model=model))
            rows[run.spec.label] = run.report()
        out[str(scale)] = rows
    return out


def speed(trace_path: str) -> dict:
    """One policy through the whole trace in a fresh process: wall time and peak RSS."""
    code = (
        "import resource, time, sys\n"
        "from vertumnus.core.types import Composition\n"
        "from vertumnus.profiles import load_model\n"
        "from vertumnus.sim.runner import PolicySpec, RunSettings, run_policy\n"
        "from vertumnus.sim.traces import load_trace, scale_rate\n"
        "t0 = time.process_time()\n"
        f"trace = scale_rate(load_trace({trace_path!r}), 8)\n"
        "t1 = time.process_time()\n"
        f"run = run_policy(PolicySpec('vertumnus', Composition.parse({POOL!r})), trace, RunSettings(model=load_model()))\n"
        "t2 = time.process_time()\n"
        "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print(len(run.result.completions), t1 - t0, t2 - t1, rss)\n"
    )
    n, load_s, sim_s, rss_mib = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        "requests": int(n),
        "load_cpu_s": float(load_s),
        "simulate_cpu_s": float(sim_s),
        "peak_rss_mib": float(rss_mib),
    }


def fit_error() -> dict:
    model = load_model()
    rows = synthesize_profile(
        model,
        [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
        [0, 4096, 16384, 65536],
        0.05,
        np.random.default_rng(0),
    )
    fit = fit_profile(rows)
    return {
        "rows": len(rows),
        "noise": 0.05,
        "mape_by_degree": {str(k): v for k, v in fit.mape_by_degree.items()},
        "alpha_rel_err": fit.model.alpha / model.alpha - 1,
        "c_rel_err": fit.model.c / model.c - 1,
        "a_rel_err": fit.model.a[1] / model.a[1] - 1,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", default=str(MOONCAKE))
    ap.add_argument("--scales", default="6,10", help="rate scales: moderate, heavy")
    ap.add_argument("--out", default="bench-out/foundation.json")
    args = ap.parse_args()
    scales = [float(s) for s in args.scales.split(",")]
    t0 = time.time()
    results = {
        "compare": compare(args.trace, scales),
        "speed": speed(args.trace),
        "fit": fit_error(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")

    for scale, rows in results["compare"].items():
        best = rows[f"vertumnus:{POOL}"]
        print(
            f"\nrate scale {scale} ({POOL}, 40 GPUs; vertumnus mean busy {best['mean_busy_fraction']:.2f})\n"
        )
        print(
            "| policy | mean TTFT s | P90 TTFT s | P99 TTFT s | SLO att. | hit rate | mean / vertumnus | P90 / vertumnus |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for label, r in rows.items():
            print(
                f"| {label} | {r['mean_ttft_s']:.3f} | {r['p90_ttft_s']:.3f} | {r['p99_ttft_s']:.3f} | "
                f"{r['slo_attainment']:.3f} | {r['token_hit_rate']:.3f} | "
                f"{r['mean_ttft_s'] / best['mean_ttft_s']:.2f}x | {r['p90_ttft_s'] / best['p90_ttft_s']:.2f}x |"
            )
    s = results["speed"]
    print(
        f"\nsimulator: {s['requests']} requests, load {s['load_cpu_s']:.2f} s CPU, "
        f"simulate {s['simulate_cpu_s']:.2f} s CPU, peak RSS {s['peak_rss_mib']:.0f} MiB"
    )
    f = results["fit"]
    print(
        "fit (5 % noise, {} rows): MAPE by degree {}; alpha {:+.1%}, c {:+.1%}, a {:+.1%}".format(
            f["rows"],
            ", ".join(f"C={k}: {v:.2%}" for k, v in f["mape_by_degree"].items()),
            f["alpha_rel_err"],
            f["c_rel_err"],
            f["a_rel_err"],
        )
    )
    print(
        f"\n(wall {time.time() - t0:.0f} s; ru_maxrss of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
