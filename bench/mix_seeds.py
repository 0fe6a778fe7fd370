"""The per-phase oracle's gain captured on many draws of each time-varying mix (issue 12).

One draw of a mix says little: on the 5-minute-phase calibration mix the
share of the oracle's gain that ``vertumnus-adaptive`` captured ranged from
12 % to 78 % over six seeds (70-95 % since, docs/benchmarks/adaptive.md). This
runs, for each mix and seed, every fixed composition of the CP4/CP8 lattice
(for the best single one and the per-phase oracle, as ``bench/time_varying.py``
defines them) and the adaptive pool under each ``--planner`` setting, side by
side on the same draws, and reports the captured share per draw, per mix (mean
and least) and overall, and where adaptive lost to the oracle: per phase, its mean
TTFT there against that phase's best fixed composition, weighted by the phase's share
of the requests (``phase_loss_ms``; they add up to adaptive's mean minus the
oracle's), with the what-if check's verdicts of each run (``damped`` counts the looks
flap damping held a merge back).

Writes ``docs/benchmarks/adaptive_mix_seeds.json``. Run::

    python bench/mix_seeds.py                      # seeds 0-5, ~10 min on 2 cores
    python bench/mix_seeds.py --seeds 0,1 --mixes calibration --planner "" \\
        --planner whatif_accumulate=false --out /tmp/seeds.json
    python bench/mix_seeds.py --mixes calibration --seeds 0-17 --planner "" \\
        --out docs/benchmarks/adaptive_mix_seeds_calibration.json   # ~5-9 min

Each draw records its fixed runs (``fixed``: composition → mean TTFT and, per
phase, mean TTFT and requests). They do not depend on the controller's
settings, so a try of other settings can read them back from an earlier file
and run the adaptive pools alone (~1.5 min for the 18 calibration draws)::

    python bench/mix_seeds.py --mixes calibration --seeds 0-17 --planner NAME=VALUE \\
        --fixed-from docs/benchmarks/adaptive_mix_seeds_calibration.json --out /tmp/try.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families import whatif_verdicts
from time_varying import EVAL_PHASES, GPUS, OUT, report, run_adaptive, run_fixed, workload

from vertumnus.core import planner
from vertumnus.core.types import Composition
from vertumnus.sim.reconfig import AdaptiveOptions
from vertumnus.sim.runner import parse_planner_settings

MIXES = {
    "evaluation": EVAL_PHASES,
    "calibration": "300s:rate=7,long=0.5,name=high;300s:rate=2.5,long=5,name=low;repeat=2",
    "heavy": "600s:rate=12,long=0.3,name=high;600s:rate=2,long=6,name=low;repeat=2",
}
"""The three stored mixes of docs/benchmarks/adaptive.md (calibration: the one the
controller's settings were chosen on)."""


def _fixed(job: tuple[str, int, str]) -> tuple[str, int, str, float, list[tuple[float, int]]]:
    mix, seed, comp = job
    trace, bounds = workload(MIXES[mix], seed)
    res, wall = run_fixed(trace, Composition.parse(comp))
    rep = report(res, bounds, wall)
    return (
        mix,
        seed,
        comp,
        rep["mean_ttft_s"],
        [(p["mean_ttft_s"], p["requests"]) for p in rep["phases"]],
    )


def _adaptive(job: tuple[str, int, str]) -> tuple[str, int, str, dict[str, Any]]:
    mix, seed, spec = job
    trace, bounds = workload(MIXES[mix], seed)
    opts = AdaptiveOptions(control=parse_planner_settings(spec))
    res, wall, sim = run_adaptive(trace, opts)
    rep = report(res, bounds, wall)
    return (
        mix,
        seed,
        spec,
        {
            "mean_ttft_s": rep["mean_ttft_s"],
            "reconfigurations": res.reconfigurations,
            "phases": [p["mean_ttft_s"] for p in rep["phases"]],
            "whatif_verdicts": whatif_verdicts(sim.attachments["controller"].windows),
        },
    )


def _phase_bests(
    fixed: dict[str, tuple[float, list[tuple[float, int]]]],
) -> list[tuple[float, int]]:
    """Per phase, the best fixed composition's (mean TTFT, requests) there."""
    runs = list(fixed.values())
    return [min((v[1][i] for v in runs), key=lambda p: p[0]) for i in range(len(runs[0][1]))]


def oracle(fixed: dict[str, tuple[float, list[tuple[float, int]]]]) -> tuple[str, float, float]:
    """Best single fixed composition, its mean, and the per-phase oracle's mean."""
    single = min(fixed, key=lambda c: fixed[c][0])
    bests = _phase_bests(fixed)
    oracle_mean = sum(m * r for m, r in bests) / sum(r for _, r in bests)
    return single, fixed[single][0], oracle_mean


def phase_losses(
    fixed: dict[str, tuple[float, list[tuple[float, int]]]], adaptive_phases: Sequence[float]
) -> list[float]:
    """Per phase, what adaptive's mean TTFT lost there against that phase's best fixed
    composition, weighted by the phase's share of the requests (ms): they add up to
    adaptive's mean minus the per-phase oracle's, so they say where it lost."""
    bests = _phase_bests(fixed)
    n = sum(requests for _, requests in bests)
    return [
        (mine - best) * requests / n * 1e3
        for mine, (best, requests) in zip(adaptive_phases, bests, strict=True)
    ]


def stored_fixed(path: Path, draws: Sequence[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    """The fixed runs of ``draws`` (mix, seed) from an earlier output of this script;
    ValueError naming the first draw it lacks (or a mix spelled otherwise there)."""
    earlier = json.loads(path.read_text())
    found = {(d["mix"], d["seed"]): d for d in earlier.get("draws", [])}
    out: dict[tuple[str, int], dict] = {}
    for mix, seed in draws:
        d = found.get((mix, seed))
        if d is None or "fixed" not in d:
            raise ValueError(f"{path} has no fixed runs of the {mix} mix, seed {seed}")
        if earlier["mixes"][mix] != MIXES[mix]:
            raise ValueError(
                f"{path}: its {mix} mix is {earlier['mixes'][mix]!r}, not {MIXES[mix]!r}"
            )
        out[(mix, seed)] = {
            comp: (mean, [tuple(p) for p in phases]) for comp, (mean, phases) in d["fixed"].items()
        }
    return out


def _seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-17`` (or both, ``0-5,9``): the seeds, in order; ValueError if not."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        first, sep, last = part.partition("-")
        if sep and first:
            lo, hi = int(first), int(last)
            if hi < lo:
                raise ValueError(part)
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(part))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-5", help="comma-separated seeds or ranges (0-17)")
    ap.add_argument("--mixes", default=",".join(MIXES), help=f"some of {','.join(MIXES)}")
    ap.add_argument(
        "--planner",
        action="append",
        help='planner settings of one adaptive run ("" = defaults), repeatable; '
        'default: "" and "whatif_accumulate=false"',
    )
    ap.add_argument("--jobs", type=int, default=2, help="simulations in parallel (default 2)")
    ap.add_argument(
        "--fixed-from",
        type=Path,
        help="read the fixed runs back from this earlier output (module docstring)",
    )
    ap.add_argument("--out", type=Path, default=OUT / "adaptive_mix_seeds.json")
    args = ap.parse_args(argv)
    try:
        seeds = _seeds(args.seeds)
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers or ranges (0-17), got {args.seeds!r}")
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    unknown = [m for m in mixes if m not in MIXES]
    if unknown:
        ap.error(f"unknown mix {unknown[0]!r}; choose from {', '.join(MIXES)}")
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    specs = args.planner if args.planner is not None else ["", "whatif_accumulate=false"]
    for spec in specs:
        try:
            parse_planner_settings(spec)
        except ValueError as e:
            ap.error(f"--planner {spec!r}: {e}")
    comps = [str(c) for c in planner.enumerate_lattice(GPUS, (4, 8))]
    t0 = time.perf_counter()
    fixed: dict[tuple[str, int], dict[str, Any]] = {}
    if args.fixed_from is not None:
        try:
            fixed = stored_fixed(args.fixed_from, [(m, s) for m in mixes for s in seeds])
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--fixed-from: {e}")
    adaptive: dict[tuple[str, int, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(args.jobs) as ex:
        if not fixed:
            jobs = [(m, s, c) for m in mixes for s in seeds for c in comps]
            for mix, seed, comp, mean, phases in ex.map(_fixed, jobs):
                fixed.setdefault((mix, seed), {})[comp] = (mean, phases)
            print(f"fixed lattice: {len(jobs)} runs, {time.perf_counter() - t0:.0f} s", flush=True)
        jobs2 = [(m, s, p) for m in mixes for s in seeds for p in specs]
        for mix, seed, spec, run in ex.map(_adaptive, jobs2):
            adaptive[(mix, seed, spec)] = run
    draws = []
    for (mix, seed), runs in fixed.items():
        single, single_mean, oracle_mean = oracle(runs)
        row: dict[str, Any] = {
            "mix": mix,
            "seed": seed,
            "best_single_fixed": single,
            "best_single_mean_s": single_mean,
            "oracle_mean_s": oracle_mean,
            "fixed": runs,
            "adaptive": {},
        }
        for spec in specs:
            run = adaptive[(mix, seed, spec)]
            mean = run["mean_ttft_s"]
            row["adaptive"][spec] = {
                "mean_ttft_s": mean,
                "captured": (single_mean - mean) / (single_mean - oracle_mean),
                "reconfigurations": run["reconfigurations"],
                "phase_loss_ms": phase_losses(runs, run["phases"]),
                "whatif_verdicts": run["whatif_verdicts"],
            }
        draws.append(row)
    summary: dict[str, Any] = {}
    for spec in specs:
        per_mix = {}
        for mix in mixes:
            caps = [d["adaptive"][spec]["captured"] for d in draws if d["mix"] == mix]
            per_mix[mix] = {"mean": sum(caps) / len(caps), "least": min(caps)}
            losses = [d["adaptive"][spec]["phase_loss_ms"] for d in draws if d["mix"] == mix]
            per_mix[mix]["phase_loss_ms"] = [
                sum(col) / len(col) for col in zip(*losses, strict=True)
            ]
        caps = [d["adaptive"][spec]["captured"] for d in draws]
        summary[spec or "(defaults)"] = {"per_mix": per_mix, "mean": sum(caps) / len(caps)}
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/mix_seeds.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "fixed_from": None if args.fixed_from is None else str(args.fixed_from),
        "mixes": {m: MIXES[m] for m in mixes},
        "seeds": seeds,
        "summary": summary,
        "draws": draws,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for spec, s in summary.items():
        mixes_line = "  ".join(
            f"{m} {v['mean'] * 100:.1f} % (least {v['least'] * 100:.1f} %)"
            for m, v in s["per_mix"].items()
        )
        print(f"{spec:28s} all {s['mean'] * 100:.1f} %  {mixes_line}")
        for m, v in s["per_mix"].items():
            where = ", ".join(f"{x:.2f}" for x in v["phase_loss_ms"])
            print(f"{'':28s} {m}: lost to the oracle per phase, mean of the draws (ms): {where}")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
