"""Capacity profiling: κ_C for each CP degree, measured in the simulator (design.md section 4).

κ_C is the largest window-level demand one degree-C worker sustains while
still meeting the target TTFT SLO attainment. We measure it the way the paper
does, with rising load on a single worker:

1. take a workload (by default the first 3,000 requests of the Mooncake
   conversation trace: real lengths and real prefix reuse);
2. for each offered load ρ in a rising grid, give the requests (in trace
   order) Poisson arrivals at the rate that offers ρ seconds of isolated
   prefill per second on degree C, and replay them through a one-worker pool
   (``1xCPC``) with cost-model placement. Poisson, not the trace's own
   timestamps: the Mooncake trace stamps up to ~19 requests with the same
   100 ms, and a single worker facing such bursts misses the target at any
   load — the profile would measure the trace's burstiness, not the worker;
3. cut the run into windows of H seconds; a window's demand is Σ Ê of the
   requests that arrived in it (Ê at placement, exactly what the controller
   measures) and its attainment is the token-weighted SLO attainment of those
   requests, each held to τ_i = max(floor, scale · E_C(L_i, 0)) — its isolated
   time on *this* degree (the run-time rule uses the largest degree, which a
   small-degree worker misses on long prompts even when idle, so it would
   measure speed instead of load);
4. κ_C is the largest demand rate (mean window demand / H) among the load
   levels whose attainment is at least the target.

``--workers N`` runs the same experiment on a pool of N degree-C workers (N
times the rate, κ per worker): how much more per worker a pool sustains than
one worker alone, because placement sends a request around a worker busy with
a long prompt. Measured on the Mooncake conversation trace, κ_4 is 0.46 alone
and 0.81–0.86 per worker in pools of 5 to 20 workers, where every degree still
meets the target at the grid's last load (docs/benchmarks/adaptive.md, "κ is
one worker's"). The shipped profile stays the one-worker measure: the paper's,
and the one the controller's thresholds were chosen with.

κ is stored as a rate (seconds of Ê per second), so one file serves any
window length; the controller multiplies by H.

This module is a shell (file I/O): the result lives next to the prefill-time
profile as ``<profile>.capacity.json`` (read with
:func:`vertumnus.profiles.load_capacity`). Regenerate it with::

    python -m vertumnus.sim.capacity --trace ../shared/traces/mooncake/conversation_trace.jsonl [--out PATH]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.metrics import SloRule, summarize
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Composition, Request
from vertumnus.sim.engine import PoolConfig, Simulation

DEFAULT_LOADS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1)


def _window_demand(
    demand: dict[int, float], window_s: float
) -> Callable[[Request, RouteDecision, bool], None]:
    """A placement listener adding each request's Ê to its arrival window's demand."""

    def add(request: Request, decision: RouteDecision, first: bool) -> None:
        k = int(request.arrival_s // window_s)
        demand[k] = demand.get(k, 0.0) + decision.estimate_s

    return add


def profile_degree(
    model: PrefillModel,
    degree: int,
    requests: Sequence[Request],
    block_size: int,
    *,
    window_s: float = 30.0,
    target: float = 0.9,
    loads: Sequence[float] = DEFAULT_LOADS,
    slo: SloRule | None = None,
    seed: int = 0,
    workers: int = 1,
) -> dict[str, Any]:
    """Drive ``workers`` degree-``degree`` workers with rising load; κ per worker and
    the per-level curve (demand per worker)."""
    if workers < 1:
        raise ValueError(f"a capacity profile needs at least one worker, got {workers}")
    slo = slo or SloRule()
    mean_isolated = sum(model.predict(degree, r.length, 0) for r in requests) / len(requests)
    # One draw of unit-rate gaps, scaled per level: the levels differ only in load.
    gaps = np.random.default_rng(seed).exponential(1.0, len(requests))
    unit_times = np.cumsum(gaps) - gaps[0]
    levels = []
    kappa = 0.0
    for rho in loads:
        # Offered isolated work per second and worker = rate · mean Ê_C(L, 0) / workers = rho.
        rate = rho * workers / mean_isolated
        reqs = [
            replace(r, arrival_s=float(t) / rate) for r, t in zip(requests, unit_times, strict=True)
        ]
        pool = PoolConfig(Composition((degree,) * workers), model, block_size=block_size, slo=slo)
        sim = Simulation(pool, CostModelPolicy())
        # Hold each request to its isolated time on *this* degree: κ measures
        # how much queueing load the worker absorbs, not whether degree C is
        # fast enough for long prompts at all (at zero load a CP1 worker
        # already misses a largest-degree target on long prompts).
        sim.slo_degree = degree
        demand: dict[int, float] = {}
        sim.placement_listeners.append(_window_demand(demand, window_s))
        result = sim.run(reqs)
        n_windows = int(reqs[-1].arrival_s // window_s) + 1
        # Full windows only: the last one is cut short by the end of the trace.
        full = [demand.get(k, 0.0) for k in range(max(1, n_windows - 1))]
        served = sum(full) / (len(full) * window_s * workers)
        att = summarize(result.completions).slo_attainment
        levels.append({"offered": rho, "demand_per_s": served, "attainment": att})
        if att >= target:
            kappa = max(kappa, served)
    return {"kappa_per_s": kappa, "levels": levels}


def profile_capacity(
    model: PrefillModel,
    requests: Sequence[Request],
    block_size: int,
    *,
    degrees: Sequence[int] | None = None,
    window_s: float = 30.0,
    target: float = 0.9,
    slo: SloRule | None = None,
    workload: str = "",
    workers: int = 1,
) -> dict[str, Any]:
    """κ_C for every degree of the profile, in the capacity-file layout (per worker of a
    pool of ``workers``; the shipped profile: one)."""
    per_degree = {
        d: profile_degree(
            model,
            d,
            requests,
            block_size,
            window_s=window_s,
            target=target,
            slo=slo,
            workers=workers,
        )
        for d in (degrees or model.degrees)
    }
    slo = slo or SloRule()
    return {
        "profile": model.name,
        "target_attainment": target,
        "window_s": window_s,
        "slo": {"scale": slo.scale, "floor_s": slo.floor_s},
        "workload": workload,
        "workers": workers,
        "kappa_per_s": {str(d): v["kappa_per_s"] for d, v in per_degree.items()},
        "levels": {str(d): v["levels"] for d, v in per_degree.items()},
        "notes": (
            "kappa_per_s: seconds of predicted prefill work per second one worker of the "
            "degree sustains at the target token-weighted TTFT SLO attainment; "
            "generated by `python -m vertumnus.sim.capacity`."
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    from vertumnus.profiles import DEFAULT_PROFILE, capacity_file, load_model
    from vertumnus.sim.traces import load_mooncake

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument(
        "--trace",
        required=True,
        help="Mooncake JSONL trace to profile with (the bundled file used the public "
        "conversation_trace.jsonl)",
    )
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument(
        "--length-scale",
        type=float,
        default=1.0,
        help="scale prompt lengths by this (with --block-size scaled alike, the prefix structure "
        "stays the same: 1/32 and 16 turn 512-token trace blocks into a tiny model's 16-token ones)",
    )
    ap.add_argument("--block-size", type=int, default=None, help="tokens per block after scaling")
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="workers of each degree in the profiled pool (default 1, the shipped profile's "
        "measure; more shows what a pool sustains per worker: give --requests enough to "
        "load them, e.g. 3000 per worker)",
    )
    ap.add_argument("--out", default=None, help="default: next to the bundled profile")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers wants a positive count, got {args.workers}")
    if args.workers > 1 and args.out is None:
        # Not next to the bundled profile: the controller would read it as κ.
        ap.error(
            "--workers above 1 measures a pool, not the profile the controller reads: give --out"
        )
    model = load_model(args.profile)
    trace = load_mooncake(args.trace)
    reqs = list(trace.requests[: args.requests])
    block_size = args.block_size or trace.block_size
    if args.length_scale != 1.0:
        reqs = [replace(r, length=max(1, round(r.length * args.length_scale))) for r in reqs]
    data = profile_capacity(
        model,
        reqs,
        block_size,
        window_s=args.window,
        target=args.target,
        workers=args.workers,
        workload=f"{Path(args.trace).name}, first {len(reqs)} requests"
        + (
            f", lengths x {args.length_scale:g}, {block_size}-token blocks"
            if args.length_scale != 1.0
            else ""
        ),
    )
    out = Path(args.out) if args.out else Path(str(capacity_file(model.name)))
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}: kappa_per_s = {data['kappa_per_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
