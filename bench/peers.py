"""Vertumnus against the peer routers, side by side (issue 4).

    python bench/peers.py --out docs/benchmarks/peers.json --plot docs/benchmarks/peers.png [--jobs 2]

Runs Vertumnus's cost-model placement and every peer of
``vertumnus.core.policies.peers`` (plus round-robin) on the same pools, trace
and prefill-time model, and prints one markdown table per pool × workload:
mean / P90 / P99 TTFT, token-weighted SLO attainment, token hit rate and
load imbalance (max / mean worker busy fraction), with ratios to the best
peer.

Workloads: the Mooncake conversation trace at three loads, and the built-in
synthetic workload (``load_trace("synthetic")``, 10 minutes, seed 0).

- **light**: the trace as recorded (rate scale 1, 3.4 req/s);
- **high**: the rate scale at which the *best* peer's P90 TTFT crosses the
  SLO, found per pool by a sweep. Requests have different SLOs
  (τ_i = max(2 s, 5 × isolated CP8 prefill)), so "P90 TTFT crosses the SLO"
  means: the 90th percentile of TTFT_i / τ_i reaches 1 (10 % of requests miss
  their SLO). The sweep steps the scale up until every peer has crossed, then
  bisects; every probe is printed;
- **moderate**: 0.75 × the high scale.

``vertumnus-adaptive`` (the composition planner and the cache manager on,
``--adaptive``) runs on the same 40 GPUs and workloads from the planner's own
initial composition, changing it as the load moves; it appears in both
pools' tables (one run per workload, shared when the loads coincide) and is
compared with the best peer on that pool.

Each run is one ``Simulation`` (``vertumnus.sim.engine``) with the settings
of ``vertumnus.sim.runner.RunSettings`` (1000 cache blocks per GPU,
T_ext = 0.05 s, SLO rule 5× / 2 s) and the bundled ``qwen3-30b-a3b/h200``
profile. Runs go to ``--jobs`` processes. About 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.core.metrics import load_imbalance, summarize
from vertumnus.core.types import Composition
from vertumnus.profiles import load_model
from vertumnus.sim.registry import KINDS
from vertumnus.sim.runner import PolicySpec, RunSettings
from vertumnus.sim.traces import Trace, load_mooncake, load_trace, scale_rate

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
POOLS = ("10xCP4", "4xCP4+3xCP8")
LONG_TOKENS = 32768
"""Requests longer than this count as long in the per-degree breakdown."""
SEED = 0

POLICIES: dict[str, str] = {
    # label -> policy kind of vertumnus.sim.registry (the same builders as
    # `vertumnus simulate --compare`). "vertumnus" is the cost-model placement
    # alone: the cache manager makes no copy on these workloads.
    "vertumnus": "vertumnus-nocm",
    **{
        kind: kind
        for kind in (
            "sglang-cache-aware",
            "llm-d",
            "llm-d-precise",
            "dynamo-kv",
            "preble",
            "aibrix-conductor",
            "vllm-kvaware",
            "round-robin",
            "least-requests",
        )
    },
}
ADAPTIVE = "vertumnus-adaptive"
"""Not bound to a pool: the planner picks and changes the composition of RunSettings.gpus GPUs."""
PEERS = [p for p in POLICIES if p != "vertumnus"]
OURS = ("vertumnus", ADAPTIVE)


@cache
def _mooncake() -> Trace:
    return load_mooncake(MOONCAKE)


@cache
def _synthetic() -> Trace:
    return load_trace("synthetic", seed=SEED)


def workload(name: str, scale: float) -> Trace:
    return _synthetic() if name == "synthetic" else scale_rate(_mooncake(), scale)


def run_one(task: tuple[str, str, str, float]) -> dict[str, Any]:
    """One policy on one pool and workload; returns its metrics (runs in a worker process)."""
    policy_name, pool, wl, scale = task
    trace = workload(wl, scale)
    settings = RunSettings(model=load_model(), seed=SEED)
    if policy_name == ADAPTIVE:
        sim = KINDS[ADAPTIVE].build(PolicySpec(ADAPTIVE, None), trace, settings)
    else:
        kind = POLICIES[policy_name]
        sim = KINDS[kind].build(PolicySpec(kind, Composition.parse(pool)), trace, settings)
    t0 = time.perf_counter()
    result = sim.run(trace.requests)
    wall = time.perf_counter() - t0
    s = summarize(result.completions).as_dict()
    ratio = np.fromiter((c.ttft_s / c.tau_s for c in result.completions), dtype=float)
    # Where the work went, by worker degree (the analysis in peers.md): the
    # peers cannot see degrees, the benchmark can.
    comps = result.completions
    top = max(c.degree for c in comps)
    length = np.fromiter((c.length for c in comps), dtype=float)
    ttft = np.fromiter((c.ttft_s for c in comps), dtype=float)
    on_top = np.fromiter((c.degree == top for c in comps), dtype=bool)
    uncached = length - np.fromiter((c.cached_tokens for c in comps), dtype=float)
    long = length > LONG_TOKENS
    busy_by_degree: dict[str, list[float]] = {}
    for c in {(c.worker, c.degree) for c in comps}:
        busy_by_degree.setdefault(f"CP{c[1]}", []).append(result.busy_fraction[c[0]])
    s.update(
        policy=policy_name,
        pool=pool,
        workload=wl,
        scale=scale,
        p90_ttft_over_slo=float(np.percentile(ratio, 90)),
        load_imbalance=load_imbalance(result.busy_fraction.values()),
        mean_busy_fraction=float(np.mean(list(result.busy_fraction.values()))),
        rejected=len(result.rejected),
        by_degree={
            "largest_degree": top,
            "long_requests_on_largest": float(on_top[long].mean()) if long.any() else None,
            "requests_on_largest": float(on_top.mean()),
            "uncached_tokens_on_largest": float(uncached[on_top].sum() / uncached.sum()),
            "mean_ttft_long_s": float(ttft[long].mean()) if long.any() else None,
            "mean_ttft_short_s": float(ttft[~long].mean()),
            "mean_busy": {k: float(np.mean(v)) for k, v in sorted(busy_by_degree.items())},
        },
        reconfigurations=result.reconfigurations,
        completed_once=len(result.completions)
        == len({c.request_id for c in result.completions})
        == len(trace),
        wall_s=wall,
    )
    return s


def find_high_scale(pool: str, ex: ProcessPoolExecutor, log: list[str]) -> float:
    """Smallest rate scale (to 0.25) at which every peer's P90 TTFT / τ is ≥ 1."""
    order = list(PEERS)
    best_below: float = 1.0
    crossed: float | None = None

    def probe(scale: float) -> bool:
        """True when all peers have crossed at ``scale``. Stops at the first peer below."""
        nonlocal order
        results = {}
        # Most scales are decided by the strongest peer alone; try the peers
        # two at a time, best first, and stop once one is still below τ.
        for i in range(0, len(order), 2):
            batch = order[i : i + 2]
            for name, r in zip(
                batch, ex.map(run_one, [(n, pool, "mooncake", scale) for n in batch]), strict=True
            ):
                results[name] = r["p90_ttft_over_slo"]
            if min(results.values()) < 1.0:
                break
        best = min(results, key=results.__getitem__)
        done = min(results.values()) >= 1.0
        order = sorted(order, key=lambda n: results.get(n, float("inf")))
        line = (
            f"  {pool} scale {scale:5.2f}: best peer so far {best} P90/τ = {results[best]:.2f}"
            f" ({len(results)} peers run) -> {'crossed' if done else 'below'}"
        )
        print(line, flush=True)
        log.append(line)
        return done

    scale = 6.0
    while crossed is None:
        if probe(scale):
            crossed = scale
        else:
            best_below = scale
            scale += 3.0
    while crossed - best_below > 0.25:
        mid = round((crossed + best_below) / 2 * 4) / 4
        if mid in (best_below, crossed):
            break
        if probe(mid):
            crossed = mid
        else:
            best_below = mid
    return crossed


def table(rows: list[dict[str, Any]]) -> str:
    peers = [r for r in rows if r["policy"] not in OURS]
    best_mean = min(r["mean_ttft_s"] for r in peers)
    best_p90 = min(r["p90_ttft_s"] for r in peers)
    out = [
        "| policy | mean TTFT s | P90 s | P99 s | SLO att. | hit rate | imbalance | mean / best peer | P90 / best peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["mean_ttft_s"]):
        name = f"**{r['policy']}**" if r["policy"] in OURS else r["policy"]
        out.append(
            f"| {name} | {r['mean_ttft_s']:.3f} | {r['p90_ttft_s']:.3f} | {r['p99_ttft_s']:.3f} | "
            f"{r['slo_attainment']:.3f} | {r['token_hit_rate']:.3f} | {r['load_imbalance']:.2f} | "
            f"{r['mean_ttft_s'] / best_mean:.2f}x | {r['p90_ttft_s'] / best_p90:.2f}x |"
        )
    return "\n".join(out)


def breakdown(rows: list[dict[str, Any]]) -> str:
    """Where each policy put the work, by worker degree (for one pool and load)."""
    if not rows:
        return ""
    head = f"### where the work went: {rows[0]['pool']}, {rows[0]['label']} (rate scale {rows[0]['scale']:g})\n\n"
    out = [
        "| policy | long (>32K) requests on largest degree | all requests on it | uncached tokens on it "
        "| mean TTFT long / short s | mean busy by degree |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["mean_ttft_s"]):
        b = r["by_degree"]
        busy = " / ".join(f"{k} {v:.2f}" for k, v in b["mean_busy"].items())
        long_share = (
            "–" if b["long_requests_on_largest"] is None else f"{b['long_requests_on_largest']:.2f}"
        )
        long_ttft = "–" if b["mean_ttft_long_s"] is None else f"{b['mean_ttft_long_s']:.2f}"
        out.append(
            f"| {r['policy']} | {long_share} | {b['requests_on_largest']:.2f} | {b['uncached_tokens_on_largest']:.2f} "
            f"| {long_ttft} / {b['mean_ttft_short_s']:.3f} | {busy} |"
        )
    return head + "\n".join(out) + "\n"


def plot(results: list[dict[str, Any]], path: Path, workloads: list[tuple[str, str]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*POLICIES, *([ADAPTIVE] if any(r["policy"] == ADAPTIVE for r in results) else [])]
    fig, axes = plt.subplots(
        len(POOLS), len(workloads), figsize=(4.2 * len(workloads), 4.4 * len(POOLS)), squeeze=False
    )
    for i, pool in enumerate(POOLS):
        for j, (label, key) in enumerate(workloads):
            ax = axes[i][j]
            rows = {r["policy"]: r for r in results if r["pool"] == pool and r["label"] == key}
            xs = np.arange(len(names))
            means = [rows[n]["mean_ttft_s"] for n in names]
            p90s = [rows[n]["p90_ttft_s"] for n in names]
            colors = [
                "tab:red" if n == "vertumnus" else "tab:orange" if n == ADAPTIVE else "tab:gray"
                for n in names
            ]
            ax.bar(xs, means, color=colors, label="mean")
            ax.scatter(xs, p90s, marker="_", s=200, color="black", zorder=3, label="P90")
            ax.set_yscale("log")
            ax.set_ylim(min(means) * 0.8, max(p90s) * 1.3)
            ax.set_xticks(xs, names, rotation=70, fontsize=7)
            ax.set_title(f"{pool} · {label}", fontsize=9)
            if j == 0:
                ax.set_ylabel("TTFT (s)")
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(
        "TTFT by policy (bars: mean, ticks: P90; log scale) — Mooncake conversation trace and synthetic"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "peers.json")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--high", type=str, default=None, help="skip the sweep: POOL=SCALE,... (e.g. 10xCP4=12)"
    )
    ap.add_argument(
        "--no-adaptive", action="store_true", help="leave out the vertumnus-adaptive row"
    )
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    sweep_log: list[str] = []
    given = dict(kv.split("=") for kv in args.high.split(",")) if args.high else {}
    results: list[dict[str, Any]] = []
    highs: dict[str, float] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        for pool in POOLS:
            if pool in given:
                highs[pool] = float(given[pool])
            else:
                print(
                    f"sweep for the high load on {pool}: step the rate scale until the best peer's P90/τ >= 1",
                    flush=True,
                )
                highs[pool] = find_high_scale(pool, ex, sweep_log)
            print(f"{pool}: high load = rate scale {highs[pool]:.2f}", flush=True)
        tasks, labels = [], []
        for pool in POOLS:
            loads = [
                ("light", "mooncake", 1.0),
                ("moderate", "mooncake", round(0.75 * highs[pool], 2)),
                ("high", "mooncake", highs[pool]),
                ("synthetic", "synthetic", 1.0),
            ]
            for label, wl, scale in loads:
                for name in POLICIES:
                    tasks.append((name, pool, wl, scale))
                    labels.append(label)
                if not args.no_adaptive:
                    tasks.append((ADAPTIVE, pool, wl, scale))
                    labels.append(label)
        # The adaptive run does not depend on the pool: run each (workload,
        # scale) once and give both pools' tables the same result.
        unique = list(
            dict.fromkeys((n, "-" if n == ADAPTIVE else p, w, sc) for n, p, w, sc in tasks)
        )
        done = dict(zip(unique, ex.map(run_one, unique), strict=True))
        for label, (n, p, w, sc) in zip(labels, tasks, strict=True):
            r = dict(done[(n, "-" if n == ADAPTIVE else p, w, sc)], pool=p, label=label)
            results.append(r)
    wall = time.perf_counter() - t_start
    assert all(r["completed_once"] and r["rejected"] == 0 for r in results), (
        "a run lost or duplicated requests"
    )

    md = []
    for pool in POOLS:
        for label in ("light", "moderate", "high", "synthetic"):
            rows = [r for r in results if r["pool"] == pool and r["label"] == label]
            scale = rows[0]["scale"]
            wl = (
                "synthetic workload (default, seed 0)"
                if label == "synthetic"
                else f"Mooncake, rate scale {scale:g}"
            )
            md.append(f"### {pool} — {label}: {wl}\n\n{table(rows)}\n")
    md.append(breakdown([r for r in results if r["pool"] == POOLS[1] and r["label"] == "moderate"]))
    text = "\n".join(md)
    print(text)
    print(f"total wall time {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
                "high_scales": highs,
                "moderate_factor": 0.75,
                "sweep": sweep_log,
                "wall_s": wall,
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )
    if args.plot is not None:
        plot(
            results,
            args.plot,
            [
                ("light", "light"),
                ("moderate", "moderate"),
                ("high", "high"),
                ("synthetic", "synthetic"),
            ],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
