"""κ that follows the workload (issue 12, item 2): the shipped κ, κ measured offline on
each family's own requests, and the κ the pool learns online.

For every workload family of ``bench/families.py``:

- **offline**: ``vertumnus.sim.capacity.profile_degree`` on the family's first 3,000
  requests — one worker, Poisson arrivals at rising load, exactly how the shipped
  profile was measured on the Mooncake trace;
- **online**: ``vertumnus-adaptive`` on the family's 15-minute cell at each load
  (defaults with ``learn_capacity=true``), and the κ its rules read at the end: the
  shipped curve's scale fitted to the pool's own windows (``vertumnus.core.kappa``).

The two are different quantities on purpose: offline κ is one worker under Poisson
arrivals; online κ is what a worker of the pool sustains under the family's real
arrivals, with the pool's placement spreading bursts. Run::

    python bench/kappa.py            # ~5 min on 2 cores

Writes ``docs/benchmarks/adaptive_kappa.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402  (the families and their cells, shared with bench/families.py)

from vertumnus.core import planner  # noqa: E402
from vertumnus.profiles import load_capacity, load_model  # noqa: E402
from vertumnus.sim.capacity import profile_degree  # noqa: E402
from vertumnus.sim.reconfig import build_adaptive  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "adaptive_kappa.json"
DEGREES = (4, 8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=OUT, help=f"where to write the JSON (default {OUT})"
    )
    out = ap.parse_args(argv).out
    model = load_model()
    shipped = load_capacity(model.name)
    rows: list[dict[str, Any]] = []
    for family in families.FAMILIES:
        source = families.FAMILIES[family][1]()
        reqs = list(source.requests[:3000])
        offline = {
            d: profile_degree(model, d, reqs, source.block_size)["kappa_per_s"] for d in DEGREES
        }
        online = {}
        for load in families.LOADS:
            trace, _ = families.workload(family, load)
            options = families.adaptive_options(trace, planner.PlannerSettings(learn_capacity=True))
            sim = build_adaptive(trace, model, options)
            sim.run(trace.requests)
            ctl = sim.attachments["controller"].controller
            online[load] = {
                "kappa": {d: ctl.capacity.kappa(d) for d in DEGREES},
                "samples": ctl.learner.samples if ctl.learner is not None else 0,
            }
        row = {"family": family, "offline": offline, "online": online}
        rows.append(row)
        print(family, json.dumps(row), file=sys.stderr, flush=True)
    lines = [
        "| family | κ_4 offline | κ_4 online light / moderate / heavy | "
        "κ_8 offline | κ_8 online light / moderate / heavy |",
        "|---|---|---|---|---|",
        f"| shipped (Mooncake) | {shipped.kappa(4):.3f} | | {shipped.kappa(8):.3f} | |",
    ]
    for r in rows:
        cells = []
        for d in DEGREES:
            on = " / ".join(f"{r['online'][ld]['kappa'][d]:.3f}" for ld in families.LOADS)
            cells.append(f"{r['offline'][d]:.3f} | {on}")
        lines.append(f"| {r['family']} | " + " | ".join(cells) + " |")
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/kappa.py",
        "shipped": {d: shipped.kappa(d) for d in DEGREES},
        "families": rows,
    }
    out.write_text(json.dumps(data, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
