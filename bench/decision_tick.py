"""One evaluation of the composition controller with the what-if check, timed.

:meth:`vertumnus.core.control.Controller.tick` — the rules plus the what-if
replay of the window's requests on the current composition and on the
compositions along the split and merge paths — with the window holding 0.75
requests per second per GPU for 20 s (the heavy Mooncake load on 40 GPUs,
30 req/s, scaled with the pool: 15,409 requests at 1,024 GPUs), drawn from
the built-in synthetic generator with reuse as an ideal cache gives it. One
evaluation of a whole window: ``check_hops`` = 1 so that one tick sees it
(with the default 4 the same evaluation runs four times per window).

Times are CPU time of the process (``time.process_time``: every thread's)
and wall clock (the decision's latency, which threads shorten), median and
maximum over ``--repeat`` calls, each on a fresh controller.

``bench/planner_speed.py`` records these for this checkout;
``bench/compare_checkouts.py`` runs this file against another checkout's
code, side by side (it only uses what every checkout since the what-if check
has, and sets ``whatif_threads`` only where it exists). Alone::

    python bench/decision_tick.py [--gpus 1024] [--threads 2] [--repeat 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

from vertumnus.core import planner
from vertumnus.core.control import Controller, history_requests
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.synthetic import SyntheticConfig, generate

CAP = planner.CapacityProfile({1: 0.29, 2: 0.38, 4: 0.46, 8: 0.63})

POOLS = {
    40: (("6xCP4+2xCP8", (4, 8)),),
    256: (("32xCP4+16xCP8", (4, 8)),),
    1024: (("128xCP4+64xCP8", (4, 8)), ("512xCP1+128xCP2+64xCP4", (1, 2, 4, 8))),
}
"""GPUs → the compositions timed there (composition, allowed degrees)."""


def time_tick(gpus: int, comp: str, degrees: tuple[int, ...], threads: int, repeat: int) -> dict:
    """Median / max CPU and wall ms of one tick on ``comp`` (module docstring)."""
    model = load_model()
    trace = generate(
        SyntheticConfig(duration_s=20.0, mean_rate=0.75 * gpus, peak_to_trough=1.0), seed=0
    )
    hist = history_requests(trace.requests, trace.block_size)
    options: dict[str, object] = {"degrees": degrees, "persist_windows": 1, "check_hops": 1}
    if threads > 1:
        if "whatif_threads" not in {f.name for f in dataclasses.fields(planner.PlannerSettings)}:
            raise SystemExit("this checkout's controller has no whatif_threads")
        options["whatif_threads"] = threads
    settings = planner.PlannerSettings(**options)  # type: ignore[arg-type]
    layout = planner.layout_for(Composition.parse(comp))
    running = {s.worker: (s.worker % 7) * 0.1 for s in layout.slots}
    cpu, wall = [], []
    last: dict[str, object] = {}
    for _ in range(repeat):
        ctl = Controller(
            planner.initial_state(layout), CAP, settings, model, None, trace.block_size
        )
        for r, h in zip(trace.requests, hist, strict=True):
            ctl.windows.placed(r, 0.01, h.cached_tokens)
        w0, c0 = time.perf_counter(), time.process_time()
        tick = ctl.tick(running, reconfiguring=False)
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
        assert tick is not None and tick.whatif is not None
        last = {
            "verdict": tick.whatif.verdict,
            "candidates": len(tick.whatif.candidates),
            "ops": len(tick.ops),
        }
    return {
        "label": f"{gpus} GPUs, {len(layout.slots)} workers ({comp}), {len(trace)} requests",
        "median_ms": statistics.median(cpu),
        "max_ms": max(cpu),
        "wall_median_ms": statistics.median(wall),
        "wall_max_ms": max(wall),
        **last,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--gpus", type=int, choices=sorted(POOLS), default=1024)
    ap.add_argument("--threads", type=int, default=1, help="whatif_threads (default 1)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.repeat < 1:
        ap.error("--threads and --repeat must be >= 1")
    found = [time_tick(args.gpus, c, d, args.threads, args.repeat) for c, d in POOLS[args.gpus]]
    for f in found:
        print(
            f"{f['label']}, {args.threads} thread(s): CPU {f['median_ms']:.1f} ms, "
            f"wall {f['wall_median_ms']:.1f} ms (median of {args.repeat})",
            file=sys.stderr,
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(found, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
