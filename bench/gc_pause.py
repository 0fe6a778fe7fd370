"""Pauses of Python's cyclic garbage collector in a process that holds a large prefix index.

The router keeps its view of the prefix cache in a :class:`~vertumnus.core.trie.PrefixTrie`
(the mirror of the Redis index). Each cached block is a ``TrieNode`` and its set of
holders (its children a set only when it has two or more), two objects the cyclic
collector tracks, although the index holds no reference cycle (parents and children are
named by key). A full collection walks every one of them, and the
interpreter runs one whenever the objects that survived into the oldest generation since
the last one reach a quarter of it. Under the churn of cache events (blocks stored and
evicted), a router with a large index therefore stops now and then for as long as one
walk of the whole index takes.

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

    python bench/gc_pause.py [--blocks 1000000] [--churn 1000000] [--mode default|freeze]

About 10 s per mode at the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import placement_speed  # noqa: E402  (the index the placement benchmark builds)


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
    pauses: list[float] = []
    began = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        elif info["generation"] == 2:
            pauses.append(time.perf_counter() - began[0])

    rng = random.Random(seed)
    fresh = iter(range(1 << 61, 1 << 62))
    live = list(prefixes)
    done = 0
    gc.callbacks.append(timed)
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
        gc.callbacks.remove(timed)
        if mode == "freeze":
            gc.unfreeze()  # this mode froze; in default mode a caller's own freeze stays
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
    args = ap.parse_args(argv)
    if args.blocks < 1000 or args.churn < 50:
        ap.error("--blocks must be >= 1000 and --churn >= 50")
    for mode in args.mode or ["default", "freeze"]:
        f = churn(mode, args.blocks, args.churn)
        print(
            f"{f['mode']:8s} {f['blocks']:,} blocks, {f['tracked_objects']:,} tracked objects, "
            f"forced full collection {f['forced_full_collection_ms']:.0f} ms; churn of "
            f"{f['stored_blocks']:,} blocks in {f['churn_s']:.1f} s: {f['full_collections']} "
            f"full collections, longest {f['longest_ms']:.0f} ms, total {f['total_ms']:.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
