"""The ``vertumnus`` command.

Subcommands:

- ``simulate`` — replay a trace (Mooncake JSONL, Azure CSV, or the built-in
  synthetic workload) through one or more placement policies side by side.
- ``fit`` — fit the prefill-time model E_C(R, P) to a measurement profile.
- ``trace-stats`` — the statistics of a trace (lengths, rate, prefix reuse).
- ``profiles`` — list the bundled prefill-time profiles.
- ``plan`` — rank the compositions of a GPU budget on a trace: where a CPPool
  should start (:mod:`vertumnus.plan`).
- ``engine verify`` / ``profile`` — the CP prefill engine (needs the
  ``worker`` extra: torch).

Every user error (a malformed trace line, a bad composition, a composition
larger than the GPU budget, a missing file) ends with one line on stderr
naming the problem and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vertumnus.flags import add_placement_flags, placement_from

if TYPE_CHECKING:
    from vertumnus.sim.traces import Trace

DEFAULT_COMPARE = (
    "vertumnus:4xCP4+3xCP8,round-robin:4xCP4+3xCP8,least-work:4xCP4+3xCP8,"
    "length-only:4xCP4+3xCP8,cache-first:4xCP4+3xCP8"
)


_EXTRA_OF = {
    "kubernetes_asyncio": "operator",
    "aiohttp": "operator",
    "yaml": "operator",
    "torch": "worker",
    "safetensors": "worker",
    "grpc": "worker",
    "grpc_health": "worker",
    "google": "worker",
    "matplotlib": "plot",
    "redis": "router",
    "prometheus_client": "router",
    "kopf": "operator",
    "msgpack": "worker",
    "zmq": "sglang",
}
"""Optional dependencies, by top-level module, and the extra that installs each."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def _number(kind: type, minimum: float, strict: bool):
    """An argparse type: a ``kind`` number above (``strict``) or at least ``minimum``."""
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}"
            ) from None
        if v < minimum or (strict and v == minimum):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return v

    return parse


_positive_float = _number(float, 0, strict=True)
_nonneg_float = _number(float, 0, strict=False)
_positive_int = _number(int, 1, strict=False)
_nonneg_int = _number(int, 0, strict=False)


def load_user_trace(
    spec: str, seed: int, prefixes: str | None, block_size: int | None = None
) -> Trace:
    """The trace a command's ``--trace`` names, with the shared system prompts of
    ``--prefixes`` given to it if set (a bad option is a :class:`UsageError`)."""
    from vertumnus.sim.traces import load_trace

    trace = load_trace(spec, seed=seed, block_size=block_size)
    if prefixes is not None:
        from vertumnus.sim.prefixes import parse_prefix_options, with_prefixes

        try:
            trace = with_prefixes(trace, parse_prefix_options(prefixes), seed=seed)
        except ValueError as e:
            raise UsageError(f"--{e}") from None
    return trace


# -- simulate -----------------------------------------------------------------


def _kinds_epilog() -> str:
    from vertumnus.sim.registry import KINDS

    width = max(map(len, KINDS))
    lines = [f"  {name.ljust(width)}  {kind.description}" for name, kind in KINDS.items()]
    return (
        "policy kinds (KIND:COMPOSITION, e.g. vertumnus:4xCP4+3xCP8; adaptive kinds take none):\n"
        + "\n".join(lines)
    )


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_kinds_epilog(),
        help="replay a trace through placement policies side by side",
        description=(
            "Replay a trace through one or more policies on a simulated prefill pool and "
            "compare TTFT, SLO attainment and prefix-cache hit rate. POLICY is KIND:COMPOSITION "
            "(e.g. vertumnus:4xCP4+3xCP8) or a kind that picks its own composition."
        ),
    )
    p.add_argument(
        "--trace",
        default="synthetic",
        help="synthetic[:KEY=VAL,...] | PATH.jsonl (Mooncake) | PATH.csv (Azure); default: synthetic",
    )
    p.add_argument(
        "--gpus", type=_positive_int, default=40, help="GPU budget of the pool (default 40)"
    )
    p.add_argument(
        "--compare",
        default=DEFAULT_COMPARE,
        help="comma-separated POLICY list (default: the five fixed-pool baselines on 4xCP4+3xCP8)",
    )
    p.add_argument(
        "--rate-scale",
        type=_positive_float,
        default=1.0,
        help="compress arrivals by X (2 = twice the request rate, every user twice as fast)",
    )
    p.add_argument(
        "--populations",
        type=_positive_int,
        default=1,
        help="serve N populations of the trace's users side by side, each with its own "
        "prefixes and its arrivals rotated: N times the rate, each conversation at its own "
        "pace (for a pool larger than the trace's; applied before --phases and --rate-scale)",
    )
    p.add_argument(
        "--length-scale",
        type=_positive_float,
        default=1.0,
        help="prompt lengths and block size times X, as `vertumnus load --length-scale` sends "
        "them to real engines (1/32: 512-token trace blocks become 16-token engine blocks)",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="clip prompts to this many tokens after scaling (as `vertumnus load` does)",
    )
    p.add_argument(
        "--requests", type=_positive_int, default=None, help="replay only the first N requests"
    )
    p.add_argument(
        "--phases",
        default=None,
        help="reshape the trace into workload phases (see docs: vertumnus.sim.phases)",
    )
    p.add_argument(
        "--prefixes",
        default=None,
        metavar="KEY=VAL,...",
        help="give a trace without prefix information (Azure) shared system prompts: "
        "n=16,zipf=1.1,median=1024,share=0.9 (see vertumnus.sim.prefixes); '' for the defaults",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed for the synthetic generator and phase resampling"
    )
    p.add_argument(
        "--profile",
        default=None,
        help="prefill-time profile: bundled name or .json path (default qwen3-30b-a3b/h200)",
    )
    p.add_argument(
        "--block-size",
        type=_positive_int,
        default=None,
        help="tokens per cache block (default: the trace's, 512)",
    )
    p.add_argument(
        "--cache-blocks-per-gpu",
        type=_nonneg_int,
        default=1000,
        help="prefix-cache capacity per GPU in blocks (default 1000)",
    )
    p.add_argument(
        "--t-ext",
        type=_nonneg_float,
        default=0.05,
        help="T_ext seconds added to every TTFT (KV transfer + first token; default 0.05)",
    )
    add_placement_flags(p)
    p.add_argument(
        "--planner",
        default=None,
        help="vertumnus-adaptive's controller settings, NAME=VALUE,... (e.g. window_s=30,persist_windows=3,degrees=2/4/8); see PlannerSettings",
    )
    p.add_argument(
        "--slo-scale",
        type=_positive_float,
        default=5.0,
        help="SLO: tau = max(floor, scale x isolated prefill on the largest degree); default 5",
    )
    p.add_argument(
        "--slo-floor", type=_nonneg_float, default=2.0, help="SLO floor in seconds (default 2)"
    )
    p.add_argument("--json", dest="json_out", default=None, help="write results as JSON here")
    p.add_argument("--plot", default=None, help="write a TTFT-over-time plot (PNG) here")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    from vertumnus.core.metrics import SloRule
    from vertumnus.core.placement import PlacementParams
    from vertumnus.profiles import DEFAULT_PROFILE, load_model
    from vertumnus.sim import report
    from vertumnus.sim.runner import (
        RunSettings,
        parse_planner_settings,
        parse_policy_specs,
        run_policy,
    )
    from vertumnus.sim.traces import Trace, scale_lengths, scale_rate

    model = load_model(args.profile or DEFAULT_PROFILE)
    specs = parse_policy_specs(args.compare, args.gpus)
    planner_settings = parse_planner_settings(args.planner)
    for out in (args.json_out, args.plot):
        if out is not None and not Path(out).resolve().parent.is_dir():
            raise UsageError(f"output folder does not exist: {Path(out).parent}")
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot needs matplotlib: pip install 'vertumnus[plot]'")
    placement = placement_from(args, PlacementParams())
    trace = load_user_trace(args.trace, args.seed, args.prefixes, args.block_size)
    if args.requests is not None:
        trace = Trace(trace.name, trace.requests[: args.requests], trace.block_size)
    trace = scale_lengths(trace, args.length_scale, args.max_tokens)
    if args.populations > 1:
        from vertumnus.sim.populations import populations

        trace = populations(trace, args.populations)
    phases: tuple[tuple[float, float, str], ...] = ()
    if args.phases:
        from vertumnus.sim.phases import apply_phases

        trace, bounds = apply_phases(trace, args.phases, seed=args.seed)
        phases = tuple(bounds)
    trace = scale_rate(trace, args.rate_scale)
    if args.rate_scale != 1.0:
        phases = tuple((s / args.rate_scale, e / args.rate_scale, label) for s, e, label in phases)
    settings = RunSettings(
        model=model,
        gpus=args.gpus,
        cache_blocks_per_gpu=args.cache_blocks_per_gpu,
        t_ext_s=args.t_ext,
        slo=SloRule(scale=args.slo_scale, floor_s=args.slo_floor),
        placement=placement,
        seed=args.seed,
        phases=phases,
        planner=planner_settings,
    )
    show = sys.stderr.isatty() if args.progress is None else args.progress
    print(
        f"trace {trace.name}: {len(trace)} requests over {trace.duration_s:.0f} s "
        f"(rate scale {args.rate_scale:g}), profile {model.name}, {args.gpus} GPUs",
        file=sys.stderr,
    )
    runs = []
    for spec in specs:
        bar = None
        if show:
            from tqdm import tqdm

            bar = tqdm(total=len(trace), desc=spec.label, unit="req", file=sys.stderr, leave=False)
        runs.append(run_policy(spec, trace, settings, bar.update if bar is not None else None))
        if bar is not None:
            bar.close()
    print(report.table(runs))
    meta = {
        "trace": {
            "name": trace.name,
            "requests": len(trace),
            "duration_s": trace.duration_s,
            "rate_scale": args.rate_scale,
            "populations": args.populations,
        },
        "settings": {
            "profile": model.name,
            "gpus": args.gpus,
            "cache_blocks_per_gpu": args.cache_blocks_per_gpu,
            "t_ext_s": args.t_ext,
            "beta": placement.beta,
            "beta_busy": placement.beta_busy,
            "lambda": placement.lam,
            "slo": {"scale": args.slo_scale, "floor_s": args.slo_floor},
            "seed": args.seed,
        },
    }
    if args.json_out:
        report.write_json(runs, meta, args.json_out)
        print(f"wrote {args.json_out}", file=sys.stderr)
    if args.plot:
        report.plot(
            runs, args.plot, f"{trace.name}, rate scale {args.rate_scale:g}, {args.gpus} GPUs"
        )
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


# -- fit ----------------------------------------------------------------------


def _add_fit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit",
        help="fit the prefill-time model to a measurement profile (CSV)",
        description="Fit E_C(R,P) = d_C + a*R + b*P + (c*R + alpha*W(R,P))/C by non-negative least squares.",
    )
    p.add_argument("profile", help="CSV with header degree,uncached_tokens,cached_tokens,seconds")
    p.add_argument(
        "--name", default=None, help="name of the fitted profile (default: the file's stem)"
    )
    p.add_argument("--out", default=None, help="write the fitted profile (JSON) here")
    p.add_argument(
        "--json", dest="json_out", default=None, help="write coefficients and errors as JSON here"
    )
    p.set_defaults(func=cmd_fit)


def cmd_fit(args: argparse.Namespace) -> int:
    from vertumnus.core.fit import fit_profile
    from vertumnus.profiles import read_profile_csv, save_model

    rows = read_profile_csv(args.profile)
    result = fit_profile(rows, name=args.name or Path(args.profile).stem)
    m = result.model
    print(f"profile {m.name}: {len(rows)} measurements, degrees {', '.join(map(str, m.degrees))}")
    print(
        f"  alpha = {m.alpha:.4g} s/pair   c = {m.c:.4g} s/token   b = {m.b:.4g} s/cached token   a = {m.a[m.degrees[0]]:.4g} s/token"
    )
    print("  degree   d_C (ms)   rows   MAPE")
    for deg in m.degrees:
        print(
            f"  {deg:>6}   {m.d[deg] * 1e3:8.3f}   {result.rows_by_degree[deg]:4d}   {result.mape_by_degree[deg] * 100:5.2f} %"
        )
    print(f"  overall MAPE {result.mape * 100:.2f} %")
    if args.out:
        save_model(m, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "model": m.to_dict(),
                    "mape_by_degree": {str(k): v for k, v in result.mape_by_degree.items()},
                    "mape": result.mape,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


# -- trace-stats, profiles ----------------------------------------------------


def _add_trace_stats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace-stats", help="statistics of a trace")
    p.add_argument(
        "trace", nargs="?", default="synthetic", help="synthetic[:...] | PATH.jsonl | PATH.csv"
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_trace_stats)


def cmd_trace_stats(args: argparse.Namespace) -> int:
    from vertumnus.sim.synthetic import trace_stats
    from vertumnus.sim.traces import load_trace

    stats = trace_stats(load_trace(args.trace, seed=args.seed))
    print(json.dumps(stats, indent=2))
    return 0


def _add_profiles(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profiles", help="list bundled prefill-time profiles")
    p.set_defaults(func=cmd_profiles)


def cmd_profiles(args: argparse.Namespace) -> int:
    from vertumnus.profiles import bundled_profiles, load_model

    for name in bundled_profiles():
        m = load_model(name)
        speed = ", ".join(f"S{c}={m.speedup(c, 65536):.2f}" for c in m.degrees if c > 1)
        print(f"{name}: degrees {', '.join(map(str, m.degrees))}; speedup at 64K tokens: {speed}")
    return 0


# -- main ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vertumnus",
        description="Prefill scheduler for long-context LLM serving over mixed-degree context-parallel workers.",
    )
    from vertumnus import __version__

    parser.add_argument("--version", action="version", version=f"vertumnus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_simulate(sub)
    _add_fit(sub)
    _add_trace_stats(sub)
    _add_profiles(sub)
    # The pool's commands. Each module imports its heavy dependencies (torch,
    # grpc, redis) only when its command runs, so --help stays fast and works
    # without the extras; a missing extra is one clear line (see main).
    from vertumnus import admin, loadgen, local, plan
    from vertumnus.router import cli as router_cli
    from vertumnus.worker import cli as worker_cli
    from vertumnus.worker import http_surface

    plan.register(sub)
    for module in (worker_cli, http_surface, router_cli, local, loadgen, admin):
        module.register(sub)
    op = sub.add_parser(
        "operator",
        help="the Kubernetes operator: run it, print its CRDs, render a pool (see `vertumnus operator -h`)",
        add_help=False,
    )
    op.set_defaults(func=lambda args: main(["operator", "--help"]))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        # The operator has a command line of its own (kopf's settings among it).
        try:
            from vertumnus.operator.__main__ import main as operator_main
        except ModuleNotFoundError as e:
            print(
                f"vertumnus: error: `vertumnus operator` needs {e.name}; install the 'operator' extra: "
                "pip install 'vertumnus[operator]'",
                file=sys.stderr,
            )
            return 2
        return int(operator_main(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from vertumnus.profiles import ProfileError
    from vertumnus.sim.traces import TraceError

    try:
        return int(args.func(args))
    except ModuleNotFoundError as e:
        extra = _EXTRA_OF.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"vertumnus: error: `vertumnus {args.command}` needs {e.name}, which is not installed; "
            f"install the {extra!r} extra: pip install 'vertumnus[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except (UsageError, TraceError, ProfileError, ValueError, FileNotFoundError) as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vertumnus: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
