"""The what-if replay against the simulator on the same requests (issue 12: tracing the
estimate's bias).

The composition controller's check (:mod:`vertumnus.core.whatif`) estimates, by a
cost-model replay, the mean TTFT each candidate composition would give. This
command puts that estimate next to what the simulator measures, on one whole
stretch of a workload, so that a bias shows as two ratios that disagree:

1. the simulator serves the stream on each composition (cost-model placement,
   fixed pool), scored from ``--skip-s`` on, T_ext taken out (the replay leaves
   it out);
2. the replay serves the same requests from ``--skip-s`` on, with the cached
   tokens each got on the *first* composition (as the controller's window
   holds the tokens served on the current composition), starting cold.

``--no-reuse SCALE`` gives every request unique block keys (no prefix reuse at
all) and stretches arrivals by SCALE to keep the load comparable: the check of
queueing and placement alone. ``--beta-busy`` sets β_busy on both sides.

    python bench/whatif_vs_sim.py --family toolagent --load moderate --draw 1
    python bench/whatif_vs_sim.py --trace synthetic:preset=toolagent,mean_rate=44,duration_s=900
    python bench/whatif_vs_sim.py --trace synthetic:preset=toolagent,mean_rate=44,duration_s=900 \\
        --no-reuse 4.5

Prints one line per composition; ~30 s per run on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402  (the workload families and their cells)

from vertumnus.core import whatif  # noqa: E402
from vertumnus.core.metrics import summarize  # noqa: E402
from vertumnus.core.placement import PlacementParams  # noqa: E402
from vertumnus.core.policies.vertumnus import CostModelPolicy  # noqa: E402
from vertumnus.core.types import Composition, Request  # noqa: E402
from vertumnus.profiles import load_model  # noqa: E402
from vertumnus.sim.engine import PoolConfig, Simulation  # noqa: E402
from vertumnus.sim.traces import Trace, load_trace  # noqa: E402


def _stream(args: argparse.Namespace) -> tuple[Trace, float]:
    """The requests and the time scoring starts at."""
    if args.trace:
        return load_trace(args.trace), args.skip_s
    if not (args.family and args.load):
        raise SystemExit("give --trace SPEC, or --family and --load (and --draw)")
    trace, _ = families.workload(args.family, args.load, args.draw)
    return trace, families.WARMUP_S if args.draw is not None else args.skip_s


def without_reuse(requests: list[Request], scale: float) -> list[Request]:
    """``requests`` with no prefix in common (every block key unique) and arrivals
    stretched by ``scale``."""
    return [
        replace(
            q,
            arrival_s=q.arrival_s * scale,
            block_keys=tuple((q.id << 20) + i + 1 for i in range(len(q.block_keys))),
        )
        for q in requests
    ]


def compare(
    requests: list[Request],
    block_size: int,
    comps: list[Composition],
    params: PlacementParams,
    skip_s: float,
) -> tuple[list[float], list[float], int]:
    """Per composition, the simulator's and the replay's mean TTFT (without T_ext) of
    the requests from ``skip_s`` on, and how many they are (module docstring)."""
    model = load_model()
    cached: dict[int, int] = {}
    sim_s: list[float] = []
    for comp in comps:
        pool = PoolConfig(comp, model, block_size=block_size)
        run = Simulation(pool, CostModelPolicy(params)).run(requests)
        done = [c for c in run.completions if c.arrival_s >= skip_s]
        sim_s.append(summarize(done).mean_ttft_s - pool.t_ext_s)
        if not cached:
            cached = {c.request_id: c.cached_tokens for c in run.completions}
    rows = [
        (q.arrival_s, q.length, cached[q.id], q.block_keys)
        for q in requests
        if q.arrival_s >= skip_s
    ]
    degrees = sorted({d for c in comps for d in c.degrees})
    table = whatif.RequestTable(rows, block_size, model, degrees)
    return sim_s, [whatif.estimate(table, c, params).mean_s for c in comps], len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", help="a trace spec, as `vertumnus simulate --trace` takes")
    ap.add_argument("--family", choices=sorted(families.FAMILIES))
    ap.add_argument("--load", choices=sorted(families.LOADS))
    ap.add_argument("--draw", type=int, help="the family cell's draw (scored after its warm-up)")
    ap.add_argument("--compositions", default="10xCP4,8xCP4+1xCP8")
    ap.add_argument("--skip-s", type=float, default=225.0, help="score from here on (default 225)")
    ap.add_argument(
        "--no-reuse", type=float, metavar="SCALE", help="unique block keys, arrivals ×SCALE"
    )
    ap.add_argument("--beta-busy", type=float, default=PlacementParams().beta_busy)
    args = ap.parse_args(argv)
    try:
        comps = [Composition.parse(c) for c in args.compositions.split(",")]
        params = PlacementParams(beta_busy=args.beta_busy)
    except ValueError as e:
        ap.error(str(e))
    if args.no_reuse is not None and args.no_reuse <= 0:
        ap.error(f"--no-reuse wants a positive scale, got {args.no_reuse}")
    trace, skip = _stream(args)
    requests = list(trace.requests)
    if args.no_reuse is not None:
        requests = without_reuse(requests, args.no_reuse)
        skip *= args.no_reuse
    sim_s, replay_s, n = compare(requests, trace.block_size, comps, params, skip)
    print(f"{n} requests scored from {skip:g} s; TTFT without T_ext")
    for comp, s_sim, s_rep in zip(comps, sim_s, replay_s, strict=True):
        print(
            f"  {str(comp):<16} simulator {s_sim:.4f} s ({s_sim / sim_s[0] - 1:+.1%})   "
            f"replay {s_rep:.4f} s ({s_rep / replay_s[0] - 1:+.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
