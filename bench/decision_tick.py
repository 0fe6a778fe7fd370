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

``--change`` times instead the look the controller makes every 2.5 s
(``check_hops`` 8) when the window holds a change of arrivals: the rate
triples for its last 5 s, so the check also replays the requests since the
change (``PlannerSettings.whatif_change``). Only the window's last look is
timed; the seven before it fill the window.

``--load 2`` doubles the rate (a window past the bound on a look's replays,
``whatif_rows``, even without a change); ``--rows N`` sets that bound.

``--shadows`` keeps the shadow pools as the controller does (``shadow``, on by
default up to ``shadow_max_gpus``), each filled first with the horizon's 600 s of
the same stream: the look then also compares them (and the time they take to
serve each request, which the look does not include, is ``bench/shadow_speed.py``'s).
Each repeat then times the same look without them too, alternately, and both are
printed side by side.

``bench/planner_speed.py`` records these for this checkout;
``bench/compare_checkouts.py`` runs this file against another checkout's
code, side by side (it only uses what every checkout since the what-if check
has, and sets ``whatif_threads`` only where it exists). Alone::

    python bench/decision_tick.py [--gpus 1024] [--threads 2] [--repeat 7] [--change]
        [--load 2] [--rows 1000000000000] [--shadows] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import statistics
import sys
import time
from dataclasses import replace

from vertumnus.core import planner
from vertumnus.core.control import Controller

try:
    from vertumnus.core.start import history_requests
except ImportError:  # a checkout from before core/start.py, run by compare_checkouts.py
    from vertumnus.core.control import history_requests  # type: ignore[attr-defined,no-redef]
from vertumnus.core.types import Composition, Request
from vertumnus.profiles import load_model
from vertumnus.sim.synthetic import SyntheticConfig, generate

CAP = planner.CapacityProfile({1: 0.29, 2: 0.38, 4: 0.46, 8: 0.63})

POOLS = {
    40: (("6xCP4+2xCP8", (4, 8)),),
    256: (("32xCP4+16xCP8", (4, 8)),),
    1024: (("128xCP4+64xCP8", (4, 8)), ("512xCP1+128xCP2+64xCP4", (1, 2, 4, 8))),
}
"""GPUs → the compositions timed there (composition, allowed degrees)."""


def _window(gpus: int, change: bool, load: float = 1.0) -> list[tuple[Request, int]]:
    """The window's requests (with the prefix each reuses): 20 s at 0.75 requests/s per
    GPU (times ``load``), or (``change``) 15 s of it and 5 s at three times the rate."""
    rate = 0.75 * gpus * load
    parts = [(0.0, 20.0, rate)] if not change else [(0.0, 15.0, rate), (15.0, 5.0, 3 * rate)]
    out: list[tuple[Request, int]] = []
    for seed, (start, duration, r) in enumerate(parts):
        config = SyntheticConfig(duration_s=duration, mean_rate=r, peak_to_trough=1.0)
        trace = generate(config, seed=seed)
        hist = history_requests(trace.requests, trace.block_size)
        for req, h in zip(trace.requests, hist, strict=True):
            moved = replace(req, id=len(out), arrival_s=req.arrival_s + start)
            out.append((moved, h.cached_tokens))
    return out


def _filled_shadows(
    gpus: int, layout: planner.Layout, settings: planner.PlannerSettings, block_size: int
) -> object:
    """The shadows a controller on ``layout`` keeps, each having served the horizon's
    requests (600 s at 0.75 per second per GPU; their clock is theirs: the look
    compares what they served over the horizon up to their latest arrival)."""
    from vertumnus.core import probes  # only in checkouts with shadows

    horizon = settings.shadow_horizon_s
    config = SyntheticConfig(duration_s=horizon, mean_rate=0.75 * gpus, peak_to_trough=1.0)
    trace = generate(config, seed=7)
    ctl = Controller(
        planner.initial_state(layout), CAP, settings, load_model(), None, block_size,
        cache_blocks_per_gpu=1000,
    )  # fmt: skip
    bank = ctl.shadows
    if bank is None:
        raise SystemExit(f"--shadows: a {gpus}-GPU pool keeps none (shadow_max_gpus)")
    workers = [planner.WorkerObservation(s.worker, 0.0, 0.0) for s in layout.slots]
    paths = probes.ends(probes.walk(layout, workers, settings))
    bank.follow([layout.composition, *paths["split"], *paths["merge"]])
    for r in sorted(trace.requests, key=lambda q: q.arrival_s):
        bank.serve(r)
    return bank


def time_tick(
    gpus: int,
    comp: str,
    degrees: tuple[int, ...],
    threads: int,
    repeat: int,
    change: bool = False,
    load: float = 1.0,
    rows: int | None = None,
    shadows: bool = False,
) -> dict:
    """Median / max CPU and wall ms of one tick on ``comp`` (module docstring);
    ``rows``: ``whatif_rows`` (None: the default); ``shadows``: with the shadow pools."""
    model = load_model()
    window = _window(gpus, change, load)
    block_size = 512
    hops = 8 if change else 1
    options: dict[str, object] = {"degrees": degrees, "persist_windows": 1, "check_hops": hops}
    fields = {f.name for f in dataclasses.fields(planner.PlannerSettings)}
    for name, value in (
        ("whatif_threads", threads if threads > 1 else None),
        ("whatif_rows", rows),
    ):
        if value is not None:
            if name not in fields:
                raise SystemExit(f"this checkout's controller has no {name}")
            options[name] = value
    settings = planner.PlannerSettings(**options)  # type: ignore[arg-type]
    layout = planner.layout_for(Composition.parse(comp))
    running = {s.worker: (s.worker % 7) * 0.1 for s in layout.slots}
    ids = [s.worker for s in layout.slots]
    bank = _filled_shadows(gpus, layout, settings, block_size) if shadows else None
    # With the shadows, each repeat also times the look without them, alternately.
    banks = (None, bank) if bank is not None else (None,)
    cpu: dict[object, list[float]] = {id(b): [] for b in banks}
    wall: list[float] = []
    last: dict[str, object] = {}
    for _ in range(repeat):
        for b in banks:
            ctl = Controller(planner.initial_state(layout), CAP, settings, model, None, block_size)
            # The worker each request went to, round robin (whatif_held starts the
            # replays from them); a checkout from before whatif_held takes none.
            placed_on = "worker" in inspect.signature(ctl.windows.placed).parameters
            if b is not None:
                ctl.shadows = b  # type: ignore[assignment]  # the same, filled, every repeat
            hop_s = 20.0 / hops
            for hop in range(hops):
                for r, cached in window:
                    if hop_s * hop <= r.arrival_s < hop_s * (hop + 1) or hops == 1:
                        on = (ids[r.id % len(ids)],) if placed_on else ()
                        ctl.windows.placed(r, 0.01, cached, *on)
                if hop < hops - 1:
                    assert ctl.tick(running, reconfiguring=False) is None  # filling the window
            w0, c0 = time.perf_counter(), time.process_time()
            tick = ctl.tick(running, reconfiguring=False)
            cpu[id(b)].append((time.process_time() - c0) * 1e3)
            if b is bank:
                wall.append((time.perf_counter() - w0) * 1e3)
            assert tick is not None and tick.whatif is not None
            if change and tick.whatif.change is None:
                raise SystemExit("--change: the window's change of arrivals was not detected")
            if b is bank:
                last = {
                    "verdict": tick.whatif.verdict,
                    "candidates": len(tick.whatif.candidates),
                    "ops": len(tick.ops),
                }
            if b is not None:
                last["shadows"] = len(b.shadows)  # type: ignore[attr-defined]
                last["shadows_compared"] = len(tick.shadow)
                last["shadow_requests"] = max((c.requests for c in tick.shadow), default=0)
    mine = cpu[id(bank)]
    if bank is not None:
        alone = cpu[id(None)]
        last["without_shadows_median_ms"] = statistics.median(alone)
        last["without_shadows_min_ms"] = min(alone)
        last["min_ms"] = min(mine)
    return {
        "label": f"{gpus} GPUs, {len(layout.slots)} workers ({comp}), {len(window)} requests"
        + (", a change of arrivals 5 s before the look" if change else "")
        + (", with the shadow pools" if shadows else ""),
        "median_ms": statistics.median(mine),
        "max_ms": max(mine),
        "wall_median_ms": statistics.median(wall),
        "wall_max_ms": max(wall),
        **last,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--gpus", type=int, choices=sorted(POOLS), default=1024)
    ap.add_argument("--threads", type=int, default=1, help="whatif_threads (default 1)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--change",
        action="store_true",
        help="time the look at a window whose last 5 s bring three times the rate",
    )
    ap.add_argument(
        "--load", type=float, default=1.0, help="times the 0.75 requests/s per GPU (default 1)"
    )
    ap.add_argument(
        "--rows", type=int, default=None, help="whatif_rows, the bound on a look's replays"
    )
    ap.add_argument(
        "--shadows", action="store_true", help="with the shadow pools, filled (module docstring)"
    )
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.repeat < 1:
        ap.error("--threads and --repeat must be >= 1")
    if args.load <= 0:
        ap.error(f"--load must be > 0, got {args.load}")
    if args.rows is not None and args.rows < 1:
        ap.error(f"--rows must be >= 1, got {args.rows}")
    found = [
        time_tick(
            args.gpus,
            c,
            d,
            args.threads,
            args.repeat,
            args.change,
            args.load,
            args.rows,
            args.shadows,
        )  # fmt: skip
        for c, d in POOLS[args.gpus]
    ]
    for f in found:
        alone = (
            f"; without them {f['without_shadows_median_ms']:.1f} ms (least of each "
            f"{f['min_ms']:.1f} / {f['without_shadows_min_ms']:.1f} ms)"
            if "without_shadows_median_ms" in f
            else ""
        )
        print(
            f"{f['label']}, {args.threads} thread(s): CPU {f['median_ms']:.1f} ms, "
            f"wall {f['wall_median_ms']:.1f} ms (median of {args.repeat}){alone}",
            file=sys.stderr,
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(found, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
