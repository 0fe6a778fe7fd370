"""Cost of one cache-manager scan over a 200K-block prefix index.

The scan walks only the *tracked* blocks (counters above the floor), so its
cost follows recent traffic, not the index size. This benchmark builds a
:class:`~vertumnus.core.trie.PrefixTrie` of ``--nodes`` blocks shaped like
the Mooncake conversation trace (one block every request shares, then
conversation chains of ``--chain`` blocks, each held by 1-3 of the 7 workers
of ``4xCP4+3xCP8``), gives ``N`` random blocks counters (a fraction ``--hot``
of them above a replication threshold, the rest low enough to be reclamation
candidates where r ≥ 2), and times :meth:`CacheManager.scan` for several
``N`` up to every block (wall and process CPU time).

With ``--sim SCALE`` it also replays the Mooncake trace at that rate scale
through ``vertumnus`` and reports the tracked-block counts and scan times
seen in the run: what ``N`` is in practice.

    python bench/cache_scan.py            # ~20 s
    python bench/cache_scan.py --sim 11   # + an in-situ measurement (~30 s)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings
from vertumnus.core.placement import WorkerState
from vertumnus.core.trie import PrefixTrie
from vertumnus.profiles import load_model

ROOT = Path(__file__).resolve().parents[1]


class View:
    """The part of a PoolView a scan reads, plus the keys in creation order."""

    def __init__(self, workers: list[WorkerState], store: PrefixTrie, keys: list[int]) -> None:
        self.workers = workers
        self.store = store
        self.keys = keys
        self.model = load_model()
        self.block_size = 512


def build(nodes: int, chain: int, seed: int) -> View:
    rng = random.Random(seed)
    degrees = [4, 4, 4, 4, 8, 8, 8]
    workers = [
        WorkerState(id=i, degree=d, cache_capacity_blocks=1000 * d, cache_used_blocks=900 * d)
        for i, d in enumerate(degrees)
    ]
    trie = PrefixTrie()
    root = 1
    for w in range(len(workers)):
        trie.apply(w, [(root, 0, None)])
    keys = [root]
    key = 2
    while len(trie) < nodes:
        holders = rng.sample(range(len(workers)), rng.choice((1, 1, 2, 3)))
        length = min(chain, nodes - len(trie))
        chain_keys = list(range(key, key + length))
        blocks = [(k, i + 1, chain_keys[i - 1] if i else root) for i, k in enumerate(chain_keys)]
        for h in holders:
            trie.apply(h, blocks)
        keys.extend(chain_keys)
        key += length
    return View(workers, trie, keys)


def time_scans(view: View, tracked: int, seed: int, repeats: int, hot: float) -> dict[str, float]:
    rng = random.Random(seed)
    settings = CacheManagerSettings()
    mgr = CacheManager(settings, store=view.store)
    mgr.scan(view)  # (as a running manager: it has scanned before)
    for key in rng.sample(view.keys, tracked):
        degree = rng.choice((4, 8))
        if rng.random() < hot:
            # above a replication threshold: a candidate the scan must rank
            if rng.random() < 0.5:
                mgr.record(key, degree, missed=settings.theta_inter * rng.uniform(1, 4))
            else:
                mgr.record(key, degree, access=settings.theta_intra * rng.uniform(1, 4))
        else:
            mgr.record(key, degree, access=rng.uniform(0, settings.theta_reclaim * 3))
    # The full candidate lists (inspection; untimed): a scan computes only
    # the head of each ranking that its bounded selection reads.
    full = mgr.candidates(view)
    times = []
    cpu = []
    read = 0
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = mgr.scan(view)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        read = max(read, len(plan.inter) + len(plan.intra) + len(plan.reclaim))
    return {
        "tracked": tracked,
        "scan_ms_first": 1e3 * times[0],
        "scan_ms_median": 1e3 * statistics.median(times),
        "scan_cpu_ms_median": 1e3 * statistics.median(cpu),
        "candidates_first_scan": len(full.inter) + len(full.intra) + len(full.reclaim),
        "candidates_read_max": read,
    }


def in_situ(scale: float) -> dict[str, float]:
    from vertumnus.core.types import Composition
    from vertumnus.sim.cachesim import build_vertumnus
    from vertumnus.sim.engine import PoolConfig
    from vertumnus.sim.traces import load_mooncake, scale_rate

    trace = scale_rate(
        load_mooncake(ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"),
        scale,
    )
    sim = build_vertumnus(PoolConfig(Composition.parse("4xCP4+3xCP8"), load_model()))
    mgr = sim.core.cache_manager
    assert mgr is not None
    seen: list[tuple[int, float, int, float]] = []
    scan = mgr.scan

    def timed(view):  # type: ignore[no-untyped-def]
        t0, c0 = time.perf_counter(), time.process_time()
        plan = scan(view)
        seen.append(
            (
                plan.tracked_nodes,
                time.perf_counter() - t0,
                len(view.store),
                time.process_time() - c0,
            )
        )
        return plan

    mgr.scan = timed
    sim.run(trace.requests)
    tracked = sorted(s[0] for s in seen)
    ms = sorted(1e3 * s[1] for s in seen)
    cpu = sorted(1e3 * s[3] for s in seen)
    return {
        "rate_scale": scale,
        "scans": len(seen),
        "trie_nodes_max": max(s[2] for s in seen),
        "tracked_median": tracked[len(tracked) // 2],
        "tracked_max": tracked[-1],
        "scan_ms_median": ms[len(ms) // 2],
        "scan_ms_p99": ms[int(0.99 * (len(ms) - 1))],
        "scan_ms_max": ms[-1],
        "scan_cpu_ms_median": cpu[len(cpu) // 2],
        "scan_cpu_ms_p99": cpu[int(0.99 * (len(cpu) - 1))],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="time one cache-manager scan")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--chain", type=int, default=25)
    ap.add_argument("--tracked", default="1000,5000,10000,20000,50000,200000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--hot",
        type=float,
        default=0.05,
        help="fraction of tracked nodes above a replication threshold (in situ: ~0)",
    )
    ap.add_argument(
        "--sim", type=float, default=0.0, help="also measure in a Mooncake run at this rate scale"
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    t0 = time.perf_counter()
    view = build(args.nodes, args.chain, seed=0)
    print(f"index: {len(view.store)} blocks built in {time.perf_counter() - t0:.1f} s")
    rows = []
    for n in (int(x) for x in args.tracked.split(",")):
        n = min(n, len(view.store))
        row = time_scans(view, n, seed=1, repeats=args.repeats, hot=args.hot)
        rows.append(row)
        print(
            f"tracked {row['tracked']:>7}: first scan {row['scan_ms_first']:7.1f} ms, "
            f"median {row['scan_ms_median']:7.1f} ms wall, {row['scan_cpu_ms_median']:7.1f} ms CPU "
            f"({row['candidates_first_scan']} candidates, {row['candidates_read_max']} read)"
        )
    doc: dict[str, object] = {"trie_nodes": len(view.store), "hot": args.hot, "synthetic": rows}
    if args.sim:
        situ = in_situ(args.sim)
        doc["in_situ"] = situ
        print("in situ:", json.dumps(situ))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
