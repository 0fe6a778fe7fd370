"""``vertumnus plan``: which composition a pool should start from, given a past workload.

An operator-run pool without ``spec.composition`` starts as the lattice point
with the most large-degree workers and lets the controller move it from there.
A platform team with a trace of the traffic the pool will serve (a Mooncake
JSONL, an Azure CSV, or the synthetic generator) can instead start where the
simulator's adaptive pool starts: this command estimates, on the trace's
requests, the mean and P90 TTFT every composition of the GPU budget would
give (the controller's what-if replay, with the prefix reuse an ideal global
cache would find in the trace: :func:`vertumnus.core.start.composition_estimates`),
ranks them, and prints the ``spec`` lines of a CPPool that starts on the best.

The estimates leave out T_ext (the KV transfer to decode) and cache capacity;
they rank compositions, they do not promise TTFTs (docs/benchmarks/adaptive.md,
"Workloads it was not tuned on").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vertumnus.core.types import Composition
    from vertumnus.core.whatif import Estimate

__all__ = ["cmd_plan", "register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="rank the compositions of a GPU budget on a trace: where a CPPool should start",
        description=(
            "Estimate the mean and P90 TTFT every composition of the GPU budget would give a "
            "trace's requests (the controller's what-if replay, prefix reuse as an ideal "
            "global cache finds it), rank them, and print a CPPool spec that starts on the best."
        ),
    )
    p.add_argument(
        "--trace",
        default="synthetic",
        help="synthetic[:KEY=VAL,...] | PATH.jsonl (Mooncake) | PATH.csv (Azure); default: synthetic",
    )
    p.add_argument("--gpus", type=int, default=40, help="GPU budget (default 40)")
    p.add_argument(
        "--gpus-per-domain", type=int, default=8, help="GPUs per NVLink domain (default 8)"
    )
    p.add_argument(
        "--degrees", default="4/8", help="allowed CP degrees, e.g. 1/2/4/8 (default 4/8)"
    )
    p.add_argument(
        "--history-s",
        type=float,
        default=None,
        help="use only the trace's first this many seconds (default: all of it)",
    )
    p.add_argument(
        "--rate-scale", type=float, default=1.0, help="compress arrivals by X (default 1)"
    )
    p.add_argument(
        "--prefixes",
        default=None,
        metavar="KEY=VAL,...",
        help="give a trace without prefix information (Azure) shared system prompts "
        "(as `vertumnus simulate --prefixes`)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator")
    p.add_argument(
        "--profile",
        default=None,
        help="prefill-time profile: bundled name or .json path (default qwen3-30b-a3b/h200)",
    )
    p.add_argument("--top", type=int, default=10, help="rows of the ranking to print (default 10)")
    p.add_argument("--json", dest="json_out", default=None, help="write the ranking as JSON here")
    p.set_defaults(func=cmd_plan)


def _degrees(text: str) -> tuple[int, ...]:
    from vertumnus.cli import UsageError

    try:
        out = tuple(sorted({int(x) for x in text.replace(",", "/").split("/") if x.strip()}))
    except ValueError:
        raise UsageError(f"--degrees {text!r}: give degrees like 4/8") from None
    if not out or any(d < 1 or d & (d - 1) for d in out):
        raise UsageError(f"--degrees {text!r}: each degree is a power of two >= 1")
    return out


def _vs(estimates: Sequence[Estimate], default: Composition, best: Estimate) -> str:
    """How the operator's default start compares with the best, if it was estimated."""
    for e in estimates:
        if e.composition == default:
            return f"estimated {e.mean_s / best.mean_s:.3f}x the best's mean TTFT"
    return "not estimated"


def cmd_plan(args: argparse.Namespace) -> int:
    from vertumnus.cli import UsageError, load_user_trace
    from vertumnus.core import planner
    from vertumnus.core.placement import PlacementParams
    from vertumnus.core.start import composition_estimates, history_requests
    from vertumnus.profiles import DEFAULT_PROFILE, load_capacity, load_model
    from vertumnus.sim.traces import scale_rate

    degrees = _degrees(args.degrees)
    if args.gpus_per_domain < 1 or args.gpus < 1 or args.gpus % args.gpus_per_domain:
        raise UsageError(
            f"--gpus {args.gpus}: a whole number of {args.gpus_per_domain}-GPU domains"
        )
    for name, value in (("--rate-scale", args.rate_scale), ("--history-s", args.history_s)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be > 0, got {value:g}")
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if args.json_out is not None and not Path(args.json_out).resolve().parent.is_dir():
        raise UsageError(f"output folder does not exist: {Path(args.json_out).parent}")
    model = load_model(args.profile or DEFAULT_PROFILE)
    missing = [d for d in degrees if not model.supports(d)]
    if missing:
        raise UsageError(
            f"--degrees: {missing} not in profile {model.name!r} (it has {list(model.degrees)})"
        )
    if max(degrees) > args.gpus_per_domain:
        raise UsageError(f"--degrees: {max(degrees)} is larger than a domain")
    settings = planner.PlannerSettings(degrees=degrees, domain_size=args.gpus_per_domain)
    try:
        lattice = planner.enumerate_lattice(args.gpus, degrees, args.gpus_per_domain)
    except ValueError as e:
        raise UsageError(str(e)) from None
    trace = scale_rate(load_user_trace(args.trace, args.seed, args.prefixes), args.rate_scale)
    history = history_requests(trace.requests, trace.block_size, args.history_s)
    if not history:
        raise UsageError(f"trace {trace.name}: no requests to plan on")
    reused = sum(h.cached_tokens for h in history) / max(1, sum(h.length for h in history))
    span = history[-1].arrival_s - history[0].arrival_s
    print(
        f"trace {trace.name}: {len(history)} requests over {span:.0f} s, "
        f"{reused:.0%} of tokens reusable; profile {model.name}; {args.gpus} GPUs, "
        f"degrees {'/'.join(map(str, degrees))}: {len(lattice)} compositions",
        file=sys.stderr,
    )
    _, estimates = composition_estimates(
        trace.requests,
        trace.block_size,
        args.history_s,
        lattice,
        load_capacity(model.name),
        model,
        settings,
        PlacementParams(),
    )
    ranked = sorted(enumerate(estimates), key=lambda ie: (ie[1].mean_s, ie[0]))
    best = ranked[0][1]
    print(f"{'rank':>4}  {'composition':<28} {'mean TTFT':>10} {'P90 TTFT':>10}  vs best")
    for rank, (_, est) in enumerate(ranked[: args.top], start=1):
        print(
            f"{rank:>4}  {str(est.composition):<28} {est.mean_s:>9.3f}s {est.p90_s:>9.3f}s  "
            f"{est.mean_s / best.mean_s:.3f}x"
        )
    if len(ranked) > args.top:
        print(f"      ... {len(ranked) - args.top} more (--top)")
    counts = Counter(best.composition.degrees)
    spec = {
        "gpus": args.gpus,
        "gpusPerDomain": args.gpus_per_domain,
        "degrees": list(degrees),
        "composition": [{"count": counts[d], "degree": d} for d in sorted(counts)],
    }
    # Without spec.composition the operator starts on the lattice's first point (the
    # most large-degree workers: vertumnus_operator.crd.PoolSpec.initial_composition).
    default = lattice[0]
    print(
        f"\nstart on {best.composition} (without spec.composition the operator starts on "
        f"{default}, {_vs(estimates, default, best)}); in the CPPool:"
    )
    print("spec:")
    for key in ("gpus", "gpusPerDomain"):
        print(f"  {key}: {spec[key]}")
    print(f"  degrees: {spec['degrees']}")
    print("  composition:")
    for part in spec["composition"]:
        print(f"    - {{count: {part['count']}, degree: {part['degree']}}}")
    print(
        "(spec.composition pins the pool there: remove it after the first rollout to let the "
        "controller move the pool, or keep it to hold the shape)",
        file=sys.stderr,
    )
    if args.json_out:
        out: dict[str, Any] = {
            "trace": {"name": trace.name, "requests": len(history), "span_s": span},
            "reusable_token_share": reused,
            "profile": model.name,
            "gpus": args.gpus,
            "degrees": list(degrees),
            "operator_default": str(default),
            "ranking": [dict(e.to_dict(), rank=r) for r, (_, e) in enumerate(ranked, start=1)],
            "cppool_spec": spec,
        }
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0
