"""Speed of this checkout against another one, side by side in one run (issue 9: "no drop in speed").

    git worktree add /tmp/before <commit>                 # the checkout to compare with
    (cd /tmp/before && python setup.py build_ext --inplace)   # its compiled placement hot path
    python bench/compare_checkouts.py --before /tmp/before [--runs 5] [--json OUT]

The figures, each measured in both trees in alternation (before, after,
before, after, ...) so that load elsewhere on a shared machine falls on both:

- **simulation**: the 12,031-request Mooncake conversation trace at rate
  scale 9 through ``vertumnus:4xCP4+3xCP8`` (cost-model placement and the
  cache manager), as ``python -m vertumnus simulate`` runs it; CPU seconds
  of the process (user + system), and wall seconds;
- **placement**: ``bench/placement_speed.py`` of each tree (64 workers, a
  1M-block trie; each tree's own version of the bench, which times the
  same ``decide`` path), decisions per second by the thread's CPU clock;
- **router** (``--router``, instead of the two above): this checkout's
  ``bench/router_overhead.py`` (instant workers, 64 closed-loop clients) run
  on each tree's router, ``--router-seconds`` each (15), with ``--redis`` the
  index and load board in a ``redis-server``; requests per second, the router
  process's CPU µs per request, placement p50 / p99; each tree needs its
  compiled protos (``cp -r src/vertumnus/_proto`` into a bare worktree);
- **decision** (``--decision``, instead of the two above): one evaluation of the composition
  controller with the what-if check on 1,024 GPUs, this checkout's
  ``bench/decision_tick.py`` run on each tree's code, wall-clock ms (median
  of its calls) on CP4/CP8 and on degrees 1–8; ``--decision-threads N``
  gives the *after* tree's check N threads (the before tree keeps one, as a
  tree without ``whatif_threads`` must, unless ``--before-threads``);
  ``--decision-change`` times the look after a change of arrivals instead
  (``decision_tick.py --change``: both trees must have it).

Each tree runs from its own ``src`` with any editable install of the
project switched off in that process, so neither tree's code leaks into the
other's run. The report gives medians, the best run of each tree (on a shared
machine noise only adds time, so the best run is the least disturbed one) and the
after/before ratios of both.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


# Run a module or a script of one tree: its src first on the path, the
# editable-install finders (which would map vertumnus.* to whichever checkout
# is installed) gone, and the tree's own folder mapping (pyproject's
# package-dir: worker/ is vertumnus.worker, ...) in their place.
_BOOT = (
    "import importlib.util, os, runpy, sys, tomllib\n"
    "tree, what = sys.argv[1], sys.argv[2]\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
    "cfg = tomllib.load(open(tree + '/pyproject.toml', 'rb'))['tool']['setuptools'].get('package-dir', {})\n"
    "class Mapped:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        d = os.path.join(tree, cfg[name]) if name and name in cfg else None\n"
    "        init = d and os.path.join(d, '__init__.py')\n"
    "        if not init or not os.path.exists(init):\n"
    "            return None\n"
    "        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[d])\n"
    "sys.meta_path.insert(0, Mapped())\n"
    "sys.path.insert(0, tree + '/src')\n"
    "sys.argv = [what, *sys.argv[3:]]\n"
    "if what.endswith('.py'):\n"
    "    runpy.run_path(what, run_name='__main__')\n"
    "else:\n"
    "    runpy.run_module(what, run_name='__main__', alter_sys=True)\n"
)


def _python(tree: Path, what: str, *args: str) -> list[str]:
    return [sys.executable, "-c", _BOOT, str(tree), what, *args]


def run_simulation(tree: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one simulation in ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        _python(
            tree,
            "vertumnus",
            "simulate",
            "--trace",
            str(MOONCAKE),
            "--rate-scale",
            "9",
            "--seed",
            "1",
            "--compare",
            "vertumnus:4xCP4+3xCP8",
            "--no-progress",
        ),
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def run_placement(tree: Path, repeat: int) -> float:
    """Decisions per second (CPU clock, median over passes) of ``tree``'s own placement bench."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        subprocess.run(
            _python(tree, "bench/placement_speed.py", "--repeat", str(repeat), "--out", str(out)),
            cwd=tree,
            check=True,
            capture_output=True,
            text=True,
        )
        return float(json.loads(out.read_text())["cpu_clock"]["decisions_per_s"])


def run_decision(tree: Path, threads: int, change: bool = False) -> list[float]:
    """Wall ms (median of 5 calls) of one 1,024-GPU evaluation with the what-if check in
    ``tree`` (this checkout's bench/decision_tick.py), per composition it times
    (``change``: the look after a change of arrivals)."""
    script = ROOT / "bench" / "decision_tick.py"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "d.json"
        flags = ["--threads", str(threads), "--repeat", "5", "--out", str(out)]
        subprocess.run(
            _python(tree, str(script), *flags, *(["--change"] if change else [])),
            cwd=tree,
            check=True,
            capture_output=True,
            text=True,
        )
        return [float(f["wall_median_ms"]) for f in json.loads(out.read_text())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (its root)")
    ap.add_argument("--after", type=Path, default=ROOT, help="this checkout (default)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--placement-repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--decision",
        action="store_true",
        help="compare the controller's what-if decision time instead",
    )
    ap.add_argument("--decision-threads", type=int, default=1)
    ap.add_argument("--before-threads", type=int, default=1)
    ap.add_argument(
        "--decision-change",
        action="store_true",
        help="with --decision: time the look after a change of arrivals",
    )
    ap.add_argument(
        "--router",
        action="store_true",
        help="compare the router's throughput and CPU per request instead",
    )
    ap.add_argument("--router-seconds", type=float, default=15.0)
    ap.add_argument("--redis", action="store_true", help="with --router: the index in Redis")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.decision_threads < 1 or args.before_threads < 1:
        ap.error("--runs, --decision-threads and --before-threads must be >= 1")
    if args.decision_change and not args.decision:
        ap.error("--decision-change needs --decision")
    if args.redis and not args.router:
        ap.error("--redis needs --router")
    if args.router:
        return compare_routers(args)
    if args.decision:
        return compare_decisions(args)
    if not MOONCAKE.exists():
        print(f"error: needs {MOONCAKE} (../shared/traces beside the checkout)", file=sys.stderr)
        return 2
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    sims: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    place: dict[str, list[float]] = {k: [] for k in trees}
    for i in range(args.runs):
        for label, tree in trees.items():
            sims[label].append(run_simulation(tree))
            print(
                f"run {i + 1}/{args.runs} {label}: simulation {sims[label][-1][0]:.2f} s CPU",
                flush=True,
            )
        for label, tree in trees.items():
            place[label].append(run_placement(tree, args.placement_repeat))
            print(
                f"run {i + 1}/{args.runs} {label}: placement {place[label][-1]:,.0f} decisions/s",
                flush=True,
            )
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "runs": args.runs,
        "trees": {k: str(v) for k, v in trees.items()},
        "simulation_cpu_s": {k: statistics.median(c for c, _ in v) for k, v in sims.items()},
        "simulation_wall_s": {k: statistics.median(w for _, w in v) for k, v in sims.items()},
        "placement_decisions_per_s": {k: statistics.median(v) for k, v in place.items()},
        # The least disturbed run of each: on a shared machine, noise only adds time.
        "best": {
            "simulation_cpu_s": {k: min(c for c, _ in v) for k, v in sims.items()},
            "placement_decisions_per_s": {k: max(v) for k, v in place.items()},
        },
        "samples": {"simulation": sims, "placement": place},
    }
    cpu, rate = report["simulation_cpu_s"], report["placement_decisions_per_s"]
    best_cpu = report["best"]["simulation_cpu_s"]
    best_rate = report["best"]["placement_decisions_per_s"]
    report["ratios"] = {
        "simulation_cpu_after_over_before": cpu["after"] / cpu["before"],
        "placement_after_over_before": rate["after"] / rate["before"],
        "best_simulation_cpu_after_over_before": best_cpu["after"] / best_cpu["before"],
        "best_placement_after_over_before": best_rate["after"] / best_rate["before"],
    }
    r = report["ratios"]
    print(
        f"simulation: {cpu['before']:.2f} s -> {cpu['after']:.2f} s CPU, median "
        f"({r['simulation_cpu_after_over_before']:.3f}x); best {best_cpu['before']:.2f} -> "
        f"{best_cpu['after']:.2f} s ({r['best_simulation_cpu_after_over_before']:.3f}x)\n"
        f"placement:  {rate['before']:,.0f} -> {rate['after']:,.0f} decisions/s, median "
        f"({r['placement_after_over_before']:.3f}x); best {best_rate['before']:,.0f} -> "
        f"{best_rate['after']:,.0f} ({r['best_placement_after_over_before']:.3f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def medians(
    found: dict[str, list[dict[str, float]]],
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Each tree's median of each figure over its runs, and after / before per figure."""
    names = list(found["after"][0])
    median = {k: {n: statistics.median(r[n] for r in v) for n in names} for k, v in found.items()}
    return median, {n: median["after"][n] / median["before"][n] for n in names}


def compare_decisions(args: argparse.Namespace) -> int:
    """The decision figure alone: both trees in alternation, medians and ratios."""
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    threads = {"before": args.before_threads, "after": args.decision_threads}
    names = ["1024 GPUs CP4/CP8", "1024 GPUs degrees 1-8"]
    found: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for i in range(args.runs):
        for label, tree in trees.items():
            ms = run_decision(tree, threads[label], args.decision_change)
            found[label].append(dict(zip(names, ms, strict=True)))
            print(f"run {i + 1}/{args.runs} {label}: decision {ms} ms", flush=True)
    median, ratios = medians(found)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "runs": args.runs,
        "trees": {k: str(v) for k, v in trees.items()},
        "threads": threads,
        "change": args.decision_change,
        "decision_wall_ms": median,
        "ratios": ratios,
        "samples": {k: [[r[n] for n in names] for r in v] for k, v in found.items()},
    }
    for n in names:
        print(
            f"decision, {n}: {median['before'][n]:.1f} -> {median['after'][n]:.1f} ms wall "
            f"({ratios[n]:.3f}x; after on {threads['after']} thread(s))"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def compare_routers(args: argparse.Namespace) -> int:
    """The router figure alone: this checkout's ``router_overhead.py`` on each tree's
    router, in alternation (the order flipped every round), medians and ratios."""
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    found: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    bench = str(ROOT / "bench" / "router_overhead.py")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
            for label, tree in order:
                out = Path(tmp) / f"{label}-{i}.json"
                extra = ["--redis"] if args.redis else []
                cmd = [bench, "--seconds", str(args.router_seconds), *extra, "--json", str(out)]
                subprocess.run(_python(tree, *cmd), cwd=tree, check=True, capture_output=True)
                d = json.loads(out.read_text())
                found[label].append(
                    {
                        "requests_per_s": d["throughput_rps"],
                        "cpu_us_per_request": d["router_cpu_us_per_request"],
                        "placement_p50_us": d["placement_us"]["p50"],
                        "placement_p99_us": d["placement_us"]["p99"],
                        "bare_proxy_requests_per_s": d["bare_proxy"]["throughput_rps"],
                    }
                )
                print(f"run {i + 1}/{args.runs} {label}: {found[label][-1]}", flush=True)
    median, ratios = medians(found)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "runs": args.runs,
        "store": "redis" if args.redis else "memory",
        "trees": {k: str(v) for k, v in trees.items()},
        "median": median,
        "ratios": ratios,
        "samples": found,
    }
    for n, ratio in ratios.items():
        print(
            f"router ({report['store']}), {n}: {median['before'][n]:,.0f} -> "
            f"{median['after'][n]:,.0f} ({ratio:.2f}x)"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
