"""Is the initial composition limited by its estimate, or by its history? (issue 12)

``vertumnus-adaptive`` starts each family cell (``bench/families.py --draws``)
on the composition whose what-if estimate (:func:`vertumnus.core.start.composition_estimates`)
is lowest on the cell's 225 s warm-up, its history. This command puts, for
every cell, three picks side by side:

- **estimate**: the shipped start (lowest estimated mean TTFT on the history);
- **simulator on the history**: the composition the simulator itself serves
  the history best with (lowest mean TTFT of the fixed pool over those
  requests): what a perfect estimate of the history would pick;
- **best scored**: the best fixed composition on the 15 minutes scored after
  the warm-up, read from the stored family file (mean over its copies).

and how many cells each start, held fixed, would meet within 1 % of the best
fixed composition on mean and P90 (the stored file's fixed runs), next to
what adaptive meets. If the simulator's pick held meets no more cells than
the estimate's, a better estimate of the history cannot raise the start's
count: the scored stretch ranks the compositions differently from its history.

``--p90-weights`` also counts the cells met by starts that weigh the P90 in:
per weight w, the estimate's and the simulator's pick by
(1 − w)·mean/best mean + w·P90/best P90 on the history (w = 0: the shipped
start), each held fixed.

    python bench/start_vs_history.py [--families mooncake,toolagent] [--json OUT]
        [--p90-weights 0,0.25,0.5,0.75,1]
    python bench/start_vs_history.py --json docs/benchmarks/adaptive_start_vs_history.json

~2 min on 2 cores (45 cells × 6 fixed simulations of a 225 s history).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402  (the workload families and their cells)

from vertumnus.core import planner  # noqa: E402
from vertumnus.core.metrics import summarize  # noqa: E402
from vertumnus.core.policies.vertumnus import CostModelPolicy  # noqa: E402
from vertumnus.core.start import composition_estimates  # noqa: E402
from vertumnus.profiles import load_capacity, load_model  # noqa: E402
from vertumnus.sim.engine import PoolConfig, Simulation  # noqa: E402
from vertumnus.sim.runner import parse_planner_settings  # noqa: E402

STORED = families.OUT.with_name("adaptive_families_replicas.json")


def cell(family: str, load: str, draw: int, stored: dict[str, Any]) -> dict[str, Any]:
    """The three picks of one cell and, per pick, its scored ratios when held fixed."""
    model = load_model()
    control = parse_planner_settings("")
    lattice = planner.enumerate_lattice(families.GPUS, control.degrees, control.domain_size)
    trace, _ = families.workload(family, load, draw)
    t0 = trace.requests[0].arrival_s
    history = [r for r in trace.requests if r.arrival_s < t0 + families.WARMUP_S]
    _, estimates = composition_estimates(
        trace.requests, trace.block_size, families.WARMUP_S, lattice,
        load_capacity(model.name), model, control,
    )  # fmt: skip
    simulated = []
    for comp in lattice:
        done = Simulation(PoolConfig(comp, model, block_size=trace.block_size), CostModelPolicy())
        summary = summarize(done.run(history).completions)
        simulated.append((summary.mean_ttft_s, summary.p90_ttft_s))
    runs = stored["runs"]
    fixed = {str(c): runs[f"vertumnus:{c}"] for c in lattice}
    best_mean = min(r["mean_ttft_s"] for r in fixed.values())
    best_p90 = min(r["p90_ttft_s"] for r in fixed.values())

    def held(comp: str) -> list[float]:
        return [fixed[comp]["mean_ttft_s"] / best_mean, fixed[comp]["p90_ttft_s"] / best_p90]

    names = [str(c) for c in lattice]
    # Ties: the first, as the shipped start breaks them.
    by_estimate = names[min(range(len(names)), key=lambda i: (estimates[i].mean_s, i))]
    by_simulator = names[min(range(len(names)), key=lambda i: (simulated[i][0], i))]
    adaptive = runs["vertumnus-adaptive"]
    return {
        "family": family,
        "load": load,
        "draw": draw,
        "estimate": {"pick": by_estimate, "held": held(by_estimate)},
        "simulator_on_history": {"pick": by_simulator, "held": held(by_simulator)},
        "best_scored_mean": min(fixed, key=lambda c: fixed[c]["mean_ttft_s"]),
        "adaptive": [adaptive["mean_ttft_s"] / best_mean, adaptive["p90_ttft_s"] / best_p90],
        "lattice": {
            name: {
                "estimate": [e.mean_s, e.p90_s],
                "simulator_on_history": list(sim),
                "held": held(name),
            }
            for name, e, sim in zip(names, estimates, simulated, strict=True)
        },
    }


def weighed_pick(values: dict[str, list[float]], weight: float) -> str:
    """The composition with the lowest (1 − weight)·mean/best mean + weight·P90/best P90
    among ``values`` (name → [mean, P90]); ties: the first."""
    best_mean = min(v[0] for v in values.values())
    best_p90 = min(v[1] for v in values.values())
    names = list(values)
    return names[
        min(
            range(len(names)),
            key=lambda i: (
                (1.0 - weight) * values[names[i]][0] / best_mean
                + weight * values[names[i]][1] / best_p90,
                i,
            ),
        )
    ]


def _met(ratios: list[float]) -> bool:
    return ratios[0] <= 1.01 and ratios[1] <= 1.01


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--families", default=",".join(families.FAMILIES))
    ap.add_argument("--stored", default=str(STORED), help="the family file with --draws 0,1,2")
    ap.add_argument("--json", help="write the cells and the counts here")
    ap.add_argument(
        "--p90-weights",
        default="",
        help="also count the starts weighing the P90 in with these weights (e.g. 0,0.5,1)",
    )
    args = ap.parse_args(argv)
    try:
        weights = [float(w) for w in args.p90_weights.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--p90-weights wants numbers in [0, 1], got {args.p90_weights!r}")
    if any(not 0.0 <= w <= 1.0 for w in weights):
        ap.error(f"--p90-weights wants numbers in [0, 1], got {args.p90_weights!r}")
    chosen = [f for f in args.families.split(",") if f]
    unknown = sorted(set(chosen) - set(families.FAMILIES))
    if unknown:
        ap.error(f"unknown families {unknown}; known: {sorted(families.FAMILIES)}")
    stored = json.loads(Path(args.stored).read_text())
    by_key = {(c["family"], c["load"], c["draw"]): c for c in stored["cells"]}
    if any(draw is None for _, _, draw in by_key):
        ap.error(f"{args.stored} holds a stretch without a warm-up: give a file of --draws")
    cells = []
    for (fam, load, draw), c in by_key.items():
        if fam in chosen:
            cells.append(cell(fam, load, draw, c))
            got = cells[-1]
            print(
                f"{fam:12s} {load:9s} d{draw}  estimate {got['estimate']['pick']:12s} "
                f"simulator {got['simulator_on_history']['pick']:12s} "
                f"best scored {got['best_scored_mean']}",
                flush=True,
            )
    counts = {
        "cells": len(cells),
        "estimate_pick_is_simulator_pick": sum(
            c["estimate"]["pick"] == c["simulator_on_history"]["pick"] for c in cells
        ),
        "estimate_pick_held_meets": sum(_met(c["estimate"]["held"]) for c in cells),
        "simulator_pick_held_meets": sum(_met(c["simulator_on_history"]["held"]) for c in cells),
        "adaptive_meets": sum(_met(c["adaptive"]) for c in cells),
    }
    for w in weights:
        for source in ("estimate", "simulator_on_history"):
            met = []
            for c in cells:
                lattice = c["lattice"]
                pick = weighed_pick({n: v[source] for n, v in lattice.items()}, w)
                met.append(_met(lattice[pick]["held"]))
            counts[f"{source}_pick_p90_weight_{w:g}_held_meets"] = sum(met)
    print(json.dumps(counts))
    if args.json:
        out = {
            "date": datetime.date.today().isoformat(),
            "command": "python bench/start_vs_history.py " + " ".join(argv or sys.argv[1:]),
            "counts": counts,
            "cells": cells,
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
