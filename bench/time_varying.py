"""Time-varying workload: ``vertumnus-adaptive`` against fixed compositions (issue 3, item 6).

The workload alternates high-rate phases dominated by short requests with
low-rate phases carrying more long requests, reshaped from the Mooncake
conversation trace by :mod:`vertumnus.sim.phases` (block size 512). On a
40-GPU pool we run

- ``vertumnus-adaptive`` (planner's initial composition from the first
  ``history_s`` seconds of the workload, controller every window, cost-model
  placement), and
- cost-model placement on every fixed composition of the CP4/CP8 lattice
  (which includes the paper's two baselines 4xCP4+3xCP8 and 6xCP4+2xCP8);
  the best of them over the whole run is reported as "best fixed";
- the **lagged oracle** (:mod:`vertumnus.sim.schedule`): each phase's best
  fixed composition, moved to ``lag`` seconds after the phase begins by the
  same executor as the adaptive pool (drains, switches, re-placement), for
  each lag of ``--lags``. Lag 0 is the per-phase oracle with its transitions
  paid; a controller that needs ``lag`` seconds to see a change can at best
  do what that lag's run does, so the curve says how much of the oracle's
  gain is within reach at the adaptive pool's own lag.

Writes ``docs/benchmarks/adaptive_time_varying.json`` and ``.png``: TTFT over
time (30 s bins) with the adaptive pool's composition beneath it, and
mean / P90 TTFT per phase. Run::

    python bench/time_varying.py            # ~3-5 min on 2 cores
    python bench/time_varying.py --quick    # one high/low cycle, for a smoke test
    python bench/time_varying.py --seed 1 --fixed 6xCP4+2xCP8,4xCP4+3xCP8 --out /tmp/tv1
                                            # another workload draw, the two baselines only
    python bench/time_varying.py --planner window_s=30   # planner settings changed
    python bench/time_varying.py --schedule "0=6xCP4+2xCP8;320=2xCP4+4xCP8"
                                            # also a schedule of compositions (seconds=composition)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.core import planner
from vertumnus.core.metrics import Completion, summarize
from vertumnus.core.placement import PlacementParams
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.engine import PoolConfig, SimResult, Simulation
from vertumnus.sim.phases import PhaseBoundary, apply_phases
from vertumnus.sim.reconfig import (
    AdaptiveOptions,
    ExecutorSettings,
    build_adaptive,
    transitions_report,
)
from vertumnus.sim.runner import parse_planner_settings
from vertumnus.sim.schedule import Move, build_scheduled, check_schedule
from vertumnus.sim.traces import Trace, load_mooncake

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
OUT = ROOT / "docs" / "benchmarks"

#: The evaluation workload: 10-minute phases, high (8x the source rate, long
#: requests down-weighted 0.3x) then low (2x, long requests up-weighted 6x), twice.
EVAL_PHASES = "600s:rate=8,long=0.3,name=high;600s:rate=2,long=6,name=low;repeat=2"
EVAL_SEED = 0
BASELINES = ("4xCP4+3xCP8", "6xCP4+2xCP8")
GPUS = 40
LAGS = (0.0, 2.5, 5.0, 10.0, 20.0)
"""Seconds after each phase boundary at which the lagged oracle moves."""


def workload(spec: str, seed: int) -> tuple[Trace, list[PhaseBoundary]]:
    return apply_phases(load_mooncake(MOONCAKE), spec, seed=seed)


def phase_stats(completions: Sequence[Completion], bounds: Sequence[PhaseBoundary]) -> list[dict]:
    out = []
    for i, (start, end, label) in enumerate(bounds):
        s = summarize([c for c in completions if start <= c.arrival_s < end])
        out.append(
            {
                "phase": i,
                "label": label,
                "start_s": start,
                "end_s": end,
                "requests": s.requests,
                "mean_ttft_s": s.mean_ttft_s,
                "p90_ttft_s": s.p90_ttft_s,
                "slo_attainment": s.slo_attainment,
                "token_hit_rate": s.token_hit_rate,
            }
        )
    return out


def report(result: SimResult, bounds: Sequence[PhaseBoundary], wall_s: float) -> dict[str, Any]:
    s = summarize(result.completions).as_dict()
    s.update(
        rejected=len(result.rejected),
        reconfigurations=result.reconfigurations,
        composition_timeline=[{"t_s": t, "composition": c} for t, c in result.composition_timeline],
        phases=phase_stats(result.completions, bounds),
        wall_s=wall_s,
    )
    return s


def run_fixed(
    trace: Trace, comp: Composition, params: PlacementParams | None = None
) -> tuple[SimResult, float]:
    model = load_model()
    sim = Simulation(PoolConfig(comp, model, block_size=trace.block_size), CostModelPolicy(params))
    t0 = time.perf_counter()
    return sim.run(trace.requests), time.perf_counter() - t0


def run_adaptive(
    trace: Trace, options: AdaptiveOptions | None = None
) -> tuple[SimResult, float, Simulation]:
    sim = build_adaptive(trace, load_model(), options)
    t0 = time.perf_counter()
    return sim.run(trace.requests), time.perf_counter() - t0, sim


def parse_schedule(text: str) -> list[Move]:
    """``SECONDS=COMPOSITION;...`` (the first at 0 s) as moves; ValueError names the entry."""
    moves = []
    for entry in (e.strip() for e in text.split(";") if e.strip()):
        at, sep, comp = entry.partition("=")
        try:
            if not sep:
                raise ValueError("expected SECONDS=COMPOSITION")
            moves.append(Move(float(at), Composition.parse(comp)))
        except ValueError as e:
            raise ValueError(f"schedule entry {entry!r}: {e}") from None
    return moves


def run_schedule(
    trace: Trace, bounds: Sequence[PhaseBoundary], policies: dict[str, dict], moves: list[Move]
) -> dict[str, Any]:
    """A pool that follows ``moves`` (:mod:`vertumnus.sim.schedule`), with the share of the
    per-phase oracle's gain over the best single fixed composition it captures."""
    sim = build_scheduled(trace, load_model(), moves, AdaptiveOptions(gpus=GPUS))
    t0 = time.perf_counter()
    result = sim.run(trace.requests)
    fixed = {k: v for k, v in policies.items() if k.startswith("vertumnus:")}
    run = {**fixed, "vertumnus-adaptive": report(result, bounds, time.perf_counter() - t0)}
    return {
        "schedule": ";".join(f"{m.at_s:g}={m.composition}" for m in moves),
        "mean_ttft_s": run["vertumnus-adaptive"]["mean_ttft_s"],
        "p90_ttft_s": run["vertumnus-adaptive"]["p90_ttft_s"],
        "captured": per_phase_oracle(run, len(bounds))["captured"],
        "reconfigurations": result.reconfigurations,
        "phases": [p["mean_ttft_s"] for p in run["vertumnus-adaptive"]["phases"]],
    }


def lagged_oracle(
    trace: Trace,
    bounds: Sequence[PhaseBoundary],
    policies: dict[str, dict],
    lags: Sequence[float],
) -> list[dict[str, Any]]:
    """The lagged oracle's run for each lag (module docstring)."""
    picks = per_phase_oracle(policies, len(bounds))["per_phase_best"]
    out = []
    for lag in lags:
        moves = [Move(0.0, Composition.parse(picks[0]["best_fixed"]))]
        for (start, _, _), pick in zip(bounds[1:], picks[1:], strict=True):
            moves.append(Move(start + lag, Composition.parse(pick["best_fixed"])))
        out.append({"lag_s": lag, **run_schedule(trace, bounds, policies, moves)})
        print(
            f"  lagged oracle, {lag:g} s: mean {out[-1]['mean_ttft_s']:.4f} s, "
            f"captured {out[-1]['captured']:.1%}",
            file=sys.stderr,
        )
    return out


def ttft_series(
    completions: Sequence[Completion], bin_s: float, end_s: float
) -> list[float | None]:
    n = int(np.ceil(end_s / bin_s))
    sums, counts = np.zeros(n), np.zeros(n)
    for c in completions:
        k = min(n - 1, int(c.arrival_s // bin_s))
        sums[k] += c.ttft_s
        counts[k] += 1
    return [float(s / c) if c else None for s, c in zip(sums, counts, strict=True)]


def verdict(policies: dict[str, dict], n_phases: int) -> dict[str, Any]:
    """The issue's claim, checked: per phase vs the better baseline, overall vs both."""
    ad = policies["vertumnus-adaptive"]
    a, b = (policies[f"vertumnus:{c}"] for c in BASELINES)
    per_phase = []
    for i in range(n_phases):
        better = min(a["phases"][i]["mean_ttft_s"], b["phases"][i]["mean_ttft_s"])
        mine = ad["phases"][i]["mean_ttft_s"]
        per_phase.append(
            {
                "phase": i,
                "label": ad["phases"][i]["label"],
                "adaptive_mean_s": mine,
                "better_fixed_mean_s": better,
                "vs_better_fixed": mine / better - 1.0,
                "vs_" + BASELINES[0]: mine / a["phases"][i]["mean_ttft_s"] - 1.0,
                "vs_" + BASELINES[1]: mine / b["phases"][i]["mean_ttft_s"] - 1.0,
                "matches_or_beats": mine <= better * 1.01,
            }
        )
    overall = {
        "vs_" + c: ad["mean_ttft_s"] / policies[f"vertumnus:{c}"]["mean_ttft_s"] - 1.0
        for c in BASELINES
    }
    overall_p90 = {
        "vs_" + c: ad["p90_ttft_s"] / policies[f"vertumnus:{c}"]["p90_ttft_s"] - 1.0
        for c in BASELINES
    }
    oracle = per_phase_oracle(policies, n_phases)
    return {
        "per_phase": per_phase,
        "oracle": oracle,
        "wrong_shape": wrong_shape(policies, n_phases),
        "overall_mean_vs": overall,
        "overall_p90_vs": overall_p90,
        "beats_both_overall": all(v < 0 for v in overall.values()),
        "every_phase_within_1pct_of_better_fixed_or_better": all(
            p["matches_or_beats"] for p in per_phase
        ),
    }


def per_phase_oracle(policies: dict[str, dict], n_phases: int) -> dict[str, Any]:
    """The per-phase oracle: each phase served by its best fixed composition (hindsight),
    and the share of its gain over the best single fixed composition adaptive captures."""
    fixed = {k: v for k, v in policies.items() if k.startswith("vertumnus:")}
    ad = policies["vertumnus-adaptive"]
    picks, total, n = [], 0.0, 0
    for i in range(n_phases):
        name = min(fixed, key=lambda k: fixed[k]["phases"][i]["mean_ttft_s"])
        ph = fixed[name]["phases"][i]
        picks.append({"phase": i, "best_fixed": name.split(":", 1)[1], "mean_s": ph["mean_ttft_s"]})
        total += ph["mean_ttft_s"] * ph["requests"]
        n += ph["requests"]
    oracle_mean = total / n
    single = min(fixed, key=lambda k: fixed[k]["mean_ttft_s"])
    single_mean = fixed[single]["mean_ttft_s"]
    gain = single_mean - oracle_mean
    return {
        "per_phase_best": picks,
        "oracle_mean_s": oracle_mean,
        "best_single_fixed": single.split(":", 1)[1],
        "best_single_mean_s": single_mean,
        "adaptive_mean_s": ad["mean_ttft_s"],
        "captured": (single_mean - ad["mean_ttft_s"]) / gain if gain > 0 else None,
    }


def wrong_shape(policies: dict[str, dict], n_phases: int) -> dict[str, Any]:
    """Per phase, adaptive against the worse of the two baselines there (the one of the
    wrong shape for that phase); ``best`` is the phase where the gap is largest."""
    ad = policies["vertumnus-adaptive"]
    rows = []
    for i in range(n_phases):
        worse = max(BASELINES, key=lambda c: policies[f"vertumnus:{c}"]["phases"][i]["mean_ttft_s"])
        w = policies[f"vertumnus:{worse}"]["phases"][i]["mean_ttft_s"]
        rows.append(
            {
                "phase": i,
                "worse_baseline": worse,
                "worse_mean_s": w,
                "adaptive_mean_s": ad["phases"][i]["mean_ttft_s"],
                "reduction": 1.0 - ad["phases"][i]["mean_ttft_s"] / w,
            }
        )
    return {"per_phase": rows, "largest_reduction": max(r["reduction"] for r in rows)}


def settled(
    results: dict[str, SimResult], transitions: Sequence[dict], bounds: Sequence[PhaseBoundary]
) -> list[dict[str, Any]]:
    """Per phase, the part after adaptive's last commit in it (its adaptation lag removed).

    Explains a per-phase gap from the data: the same requests, every policy,
    from the moment the adaptive pool stopped changing in that phase.
    """
    out = []
    for i, (start, end, label) in enumerate(bounds):
        commits = [
            t["started_s"] + t["total_s"] for t in transitions if start <= t["started_s"] < end
        ]
        t0 = max(commits, default=start)
        row: dict[str, Any] = {
            "phase": i,
            "label": label,
            "settled_from_s": t0,
            "lag_s": t0 - start,
        }
        for name, res in results.items():
            row[name] = summarize(
                [c for c in res.completions if t0 <= c.arrival_s < end]
            ).mean_ttft_s
        out.append(row)
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bounds = data["phases"]
    pols = data["policies"]
    bin_s = data["bin_s"]
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]}
    )
    shown = ["vertumnus-adaptive", *(f"vertumnus:{c}" for c in BASELINES)]
    best = data["best_fixed"]
    if f"vertumnus:{best}" not in shown:
        shown.append(f"vertumnus:{best}")
    styles = {"vertumnus-adaptive": dict(color="C3", lw=2.0)}
    for i, name in enumerate(shown):
        series = data["ttft_series"][name]
        t = [(k + 0.5) * bin_s / 60 for k, v in enumerate(series) if v is not None]
        v = [x for x in series if x is not None]
        ax.plot(t, v, label=name, **styles.get(name, dict(color=f"C{i}", lw=1.1)))
    for start, end, label in bounds:
        if label.startswith("low"):
            ax.axvspan(start / 60, end / 60, color="0.9", zorder=0)
            ax2.axvspan(start / 60, end / 60, color="0.9", zorder=0)
    ax.set_ylabel("mean TTFT per 30 s (s)")
    ax.set_yscale("log")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Time-varying workload (shaded: low-rate, long-heavy phases), 40 GPUs")
    timeline = pols["vertumnus-adaptive"]["composition_timeline"]
    end = bounds[-1][1]
    xs, ys = [], []
    for i, e in enumerate(timeline):
        nxt = timeline[i + 1]["t_s"] if i + 1 < len(timeline) else end
        n8 = Composition.parse(e["composition"]).count(8)
        xs += [e["t_s"] / 60, nxt / 60]
        ys += [n8, n8]
    ax2.plot(xs, ys, color="C3", lw=2)
    for e in timeline:
        ax2.annotate(
            e["composition"].replace("+", "/"),
            (e["t_s"] / 60, Composition.parse(e["composition"]).count(8)),
            fontsize=6,
            rotation=30,
            xytext=(2, 4),
            textcoords="offset points",
        )
    ax2.set_ylabel("CP8 workers\n(adaptive)")
    ax2.set_ylim(-0.5, 5.9)
    ax2.set_xlabel("time (min)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", default=EVAL_PHASES)
    ap.add_argument("--seed", type=int, default=EVAL_SEED)
    ap.add_argument("--quick", action="store_true", help="one high/low cycle of 5-minute phases")
    ap.add_argument("--out", default=str(OUT / "adaptive_time_varying"))
    ap.add_argument(
        "--fixed",
        default="",
        help="comma-separated fixed compositions to run (default: the whole CP4/CP8 lattice)",
    )
    ap.add_argument(
        "--planner",
        default="",
        help="planner settings for the adaptive pool, e.g. 'window_s=30,persist_windows=3'",
    )
    ap.add_argument(
        "--lags",
        default=",".join(f"{x:g}" for x in LAGS),
        help="seconds after each phase boundary at which the lagged oracle moves "
        "(comma-separated; empty: no lagged oracle)",
    )
    ap.add_argument(
        "--schedule",
        action="append",
        default=[],
        metavar="SECONDS=COMPOSITION;...",
        help="also run a pool that follows this schedule of compositions (the first at 0 s; "
        "repeatable), e.g. a controller's moves played back",
    )
    ap.add_argument(
        "--no-rebalance",
        action="store_true",
        help="the adaptive pool leaves queued requests where they are at a commit "
        "(the behaviour before 2026-12-02, for comparison)",
    )
    args = ap.parse_args(argv)
    control = parse_planner_settings(args.planner)
    try:
        lags = [float(x) for x in args.lags.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--lags {args.lags!r}: give seconds, e.g. 0,2.5,5")
    if any(x < 0 for x in lags):
        ap.error(f"--lags {args.lags!r}: a lag is >= 0 s")
    try:
        schedules = [parse_schedule(text) for text in args.schedule]
        for moves in schedules:
            check_schedule(moves, AdaptiveOptions(gpus=GPUS))
    except ValueError as e:
        ap.error(f"--schedule: {e}")
    spec = (
        "300s:rate=8,long=0.3,name=high;300s:rate=2,long=6,name=low" if args.quick else args.phases
    )
    trace, bounds = workload(spec, args.seed)
    print(
        f"workload: {len(trace)} requests over {trace.duration_s:.0f} s ({spec})", file=sys.stderr
    )
    policies: dict[str, dict] = {}
    series: dict[str, list] = {}
    raw: dict[str, SimResult] = {}
    bin_s = 30.0
    end = bounds[-1][1]
    executor = ExecutorSettings(rebalance=not args.no_rebalance)
    result, wall, sim = run_adaptive(trace, AdaptiveOptions(control=control, executor=executor))
    policies["vertumnus-adaptive"] = report(result, bounds, wall)
    raw["vertumnus-adaptive"] = result
    controller = sim.attachments["controller"]
    policies["vertumnus-adaptive"]["transitions"] = transitions_report(
        sim.attachments["executor"].transitions
    )
    policies["vertumnus-adaptive"]["windows"] = controller.windows
    # CPU ms per tick, leaving out the ticks that met a full collection of the
    # simulating process's garbage collector (counted apart: not the planner's cost).
    costs = np.array(controller.own_decision_cost_s()) * 1e3
    policies["vertumnus-adaptive"]["planner_ms_per_window"] = {
        "mean": float(costs.mean()) if costs.size else 0.0,
        "max": float(costs.max()) if costs.size else 0.0,
        "ticks_with_full_gc": len(controller.decision_cost_s) - costs.size,
    }
    series["vertumnus-adaptive"] = ttft_series(result.completions, bin_s, end)
    print(
        f"  adaptive: mean {policies['vertumnus-adaptive']['mean_ttft_s']:.4f} s, "
        f"{result.reconfigurations} reconfigurations, {wall:.1f} s",
        file=sys.stderr,
    )
    fixed_set = (
        [Composition.parse(c) for c in args.fixed.split(",")]
        if args.fixed
        else planner.enumerate_lattice(GPUS, (4, 8))
    )
    for comp in fixed_set:
        result, wall = run_fixed(trace, comp)
        name = f"vertumnus:{comp}"
        policies[name] = report(result, bounds, wall)
        if str(comp) in BASELINES:
            raw[name] = result
        series[name] = ttft_series(result.completions, bin_s, end)
        print(
            f"  {name}: mean {policies[name]['mean_ttft_s']:.4f} s, {wall:.1f} s", file=sys.stderr
        )
    fixed = {k: v for k, v in policies.items() if k.startswith("vertumnus:")}
    best = min(fixed, key=lambda k: fixed[k]["mean_ttft_s"]).split(":", 1)[1]
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(
            ["python bench/time_varying.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "trace": "mooncake conversation_trace.jsonl, block size 512",
        "phases_spec": spec,
        "seed": args.seed,
        "requests": len(trace),
        "gpus": GPUS,
        "phases": bounds,
        "bin_s": bin_s,
        "best_fixed": best,
        "settings": {
            "planner": control.__dict__,
            "placement": {"beta": PlacementParams().beta, "lam": PlacementParams().lam},
            "switch_delay_s": executor.switch_delay_s,
            "rebalance": executor.rebalance,
            "history_s": AdaptiveOptions().history_s,
        },
        "policies": policies,
        "ttft_series": series,
    }
    data["verdict"] = verdict(policies, len(bounds))
    data["verdict"]["oracle"]["lagged"] = lagged_oracle(trace, bounds, policies, lags)
    data["verdict"]["oracle"]["schedules"] = [
        run_schedule(trace, bounds, policies, moves) for moves in schedules
    ]
    data["verdict"]["settled_phases"] = settled(
        raw, policies["vertumnus-adaptive"]["transitions"], bounds
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    plot(data, out.with_suffix(".png"))
    print(json.dumps(data["verdict"], indent=1))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
