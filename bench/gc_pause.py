"""Pauses of Python's cyclic garbage collector in a process that holds a large prefix index.

The router keeps its view of the prefix cache in a :class:`~vertumnus.core.trie.PrefixTrie`
(the mirror of the Redis index). A full collection of Python's cyclic collector walks
every object the collector tracks, and the interpreter runs one whenever the objects that
survived into the oldest generation since the last one reach a quarter of it. Built
without its compiled node, the index is two such objects per cached block (a ``TrieNode``
and its set of holders) plus one per logged change, although it holds no reference cycle;
under the churn of cache events a router with a large index then stops now and then for as
long as one walk of the whole index takes. With the compiled node
(``vertumnus.core._trienode``, what ``pip install`` builds where there is a C compiler)
none of them is tracked, and the churn adds no survivor.

This command builds the index of ``bench/placement_speed.py`` (``--blocks`` blocks over
64 workers), then churns it at a constant size: a new 54-block conversation prefix on one
worker, the oldest conversation evicted from every holder, until ``--churn`` blocks were
stored. It prints how many objects the collector tracks, how long one forced full
collection takes, and every automatic full collection during the churn (count, longest,
total), by the wall clock:

- ``default``: the interpreter's settings, as the router runs today;
- ``freeze``: ``gc.freeze()`` after the index is built (what ``placement_speed.py`` does
  before timing decisions), which keeps the first index out of the walks until churn
  has replaced it.

With ``--node`` the index uses the compiled node, its pure-Python twin, or (the default)
each in turn, side by side in one run.

    python bench/gc_pause.py [--blocks 1000000] [--churn 1000000] [--mode default|freeze]
        [--node compiled|python]

About 10 s per mode and node at the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import placement_speed  # noqa: E402  (the index the placement benchmark builds)

from vertumnus.core import trie  # noqa: E402
from vertumnus.core.trienode import python_nodes  # noqa: E402
from vertumnus.gcpauses import CollectorPauses  # noqa: E402


def churn(mode: str, blocks: int, stored: int, seed: int = 1) -> dict[str, Any]:
    """The figures of one mode (module docstring)."""
    pool, prefixes = placement_speed.build(64, blocks, 0)
    trie = pool.store
    gc.collect()
    tracked = len(gc.get_objects())
    t0 = time.perf_counter()
    gc.collect()
    forced_ms = 1e3 * (time.perf_counter() - t0)
    if mode == "freeze":
        gc.freeze()
    # Every collection is kept (young ones run thousands of times in a long churn).
    timed = CollectorPauses(keep=10_000_000)
    rng = random.Random(seed)
    fresh = iter(range(1 << 61, 1 << 62))
    live = list(prefixes)
    done = 0
    timed.start()
    try:
        t0 = time.perf_counter()
        while done < stored:
            keys = live[rng.randrange(len(live))][:4] + tuple(next(fresh) for _ in range(50))
            trie.apply(rng.randrange(64), placement_speed.chain(keys))
            done += 50
            oldest = live.pop(0)
            for worker in list(trie.holders(oldest[4])):
                trie.apply(worker, removed=oldest[:3:-1])
            live.append(keys)
        wall = time.perf_counter() - t0
    finally:
        timed.stop()
        if mode == "freeze":
            gc.unfreeze()  # this mode froze; in default mode a caller's own freeze stays
    pauses = [s for generation, s in timed.drain() if generation == 2]
    return {
        "mode": mode,
        "blocks": len(trie),
        "tracked_objects": tracked,
        "forced_full_collection_ms": forced_ms,
        "stored_blocks": done,
        "churn_s": wall,
        "full_collections": len(pauses),
        "longest_ms": 1e3 * max(pauses, default=0.0),
        "total_ms": 1e3 * sum(pauses),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--blocks", type=int, default=1_000_000, help="the index's size in blocks")
    ap.add_argument("--churn", type=int, default=1_000_000, help="blocks stored while churning")
    ap.add_argument("--mode", choices=("default", "freeze"), action="append")
    ap.add_argument(
        "--node",
        choices=("compiled", "python"),
        action="append",
        help="the index's node: the compiled one (out of the collector), the pure-Python "
        "twin (a build without a C compiler), or both side by side (the default)",
    )
    args = ap.parse_args(argv)
    if args.blocks < 1000 or args.churn < 50:
        ap.error("--blocks must be >= 1000 and --churn >= 50")
    nodes = args.node or ["compiled", "python"]
    if "compiled" in nodes and not trie.UNTRACKED:
        ap.error("--node compiled: this build has no compiled node (no C compiler at install)")
    for node, mode in itertools.product(nodes, args.mode or ["default", "freeze"]):
        with python_nodes() if node == "python" else contextlib.nullcontext():
            f = churn(mode, args.blocks, args.churn)
        print(
            f"{node:8s} {f['mode']:8s} {f['blocks']:,} blocks, {f['tracked_objects']:,} tracked objects, "
            f"forced full collection {f['forced_full_collection_ms']:.0f} ms; churn of "
            f"{f['stored_blocks']:,} blocks in {f['churn_s']:.1f} s: {f['full_collections']} "
            f"full collections, longest {f['longest_ms']:.0f} ms, total {f['total_ms']:.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
