"""Prefix-index speed: the in-process store against the Redis store, side by side (issue 10).

    python bench/store_speed.py [--blocks 100000] [--workers 64] [--requests 2000]
                                [--batches 500] [--repeat 5] [--redis-url redis://host:port/db]
                                [--json OUT]

Builds the same index in a :class:`~vertumnus.core.trie.PrefixTrie` and a
:class:`~vertumnus.router.redis_store.RedisTrieStore` — a few hot system
prompts (8–32 blocks) cached on a quarter to half of the pool, and
conversations that extend one of them to 16–256 blocks, each cached on one
to three of that prompt's holders, until the index has ``--blocks`` blocks —
then times, one call at a time, on the wall clock:

``matched_blocks``
    a request's whole chain (a cached conversation cut at a random depth,
    plus 0–16 blocks nobody has), i.e. placement's lookup: per request p50,
    p99 and mean in µs.
``apply_store``
    a typical completion batch: a worker that holds a conversation stores the
    16 blocks its request added (key, position, parent).
``apply_remove``
    the matching eviction batch (the same 16 blocks removed), which also
    keeps the index at its size between runs.

Each figure is the **median over ``--repeat`` passes** (every pass is in the
JSON). For Redis the server's own time per ``EVALSHA`` (``INFO
commandstats``) and a bare ``PING`` round trip are reported too, which says
where a call's time goes: the script, or the client and the socket.

Without ``--redis-url`` the script starts its own ``redis-server`` (Debian's
package) on a free loopback port with no persistence, and stops it at the
end; with one, it works in a namespace of its own and deletes it afterwards
(credentials as for the router: ``VERTUMNUS_REDIS_PASSWORD_FILE``, ...).
Answers of the two stores are compared on every request (a benchmark of a
wrong store is worthless).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from vertumnus.core.store import TrieStore
from vertumnus.core.trie import PrefixTrie
from vertumnus.router.redis_conn import redis_client
from vertumnus.router.redis_store import RedisTrieStore

Item = tuple[int, int, int | None]


def chain(keys: Sequence[int], start: int = 0) -> list[Item]:
    """Stored events for ``keys[start:]``: (key, position, parent)."""
    return [(keys[i], i, keys[i - 1] if i else None) for i in range(start, len(keys))]


class Index:
    """The shape of a long-context pool's prefix index, as events."""

    def __init__(self, n_blocks: int, n_workers: int, seed: int) -> None:
        rng = random.Random(seed)
        self.rng = rng
        fresh = iter(range(1, 1 << 62))
        self.fresh = fresh
        self.heads: list[tuple[tuple[int, ...], list[int]]] = []
        for _ in range(max(4, n_workers // 4)):
            keys = tuple(next(fresh) for _ in range(rng.randint(8, 32)))
            holders = rng.sample(
                range(n_workers), rng.randint(max(1, n_workers // 4), max(1, n_workers // 2))
            )
            self.heads.append((keys, holders))
        # (keys, holders) of each conversation, every one extending a head.
        self.conversations: list[tuple[tuple[int, ...], list[int]]] = []
        total = sum(len(k) for k, _ in self.heads)
        while total < n_blocks:
            head, head_holders = self.heads[rng.randrange(len(self.heads))]
            length = rng.randint(max(16, len(head) + 1), 256)
            keys = head + tuple(next(fresh) for _ in range(length - len(head)))
            holders = rng.sample(head_holders, min(len(head_holders), rng.randint(1, 3)))
            self.conversations.append((keys, holders))
            total += length - len(head)

    def events(self) -> Iterator[tuple[int, list[Item]]]:
        for keys, holders in self.heads:
            for w in holders:
                yield w, chain(keys)
        for keys, holders in self.conversations:
            for w in holders:
                yield w, chain(keys)

    def requests(self, n: int) -> list[tuple[int, ...]]:
        rng, out = self.rng, []
        for _ in range(n):
            keys, _ = self.conversations[rng.randrange(len(self.conversations))]
            cut = rng.randint(min(16, len(keys)), len(keys))
            extra = rng.randint(0, 16)
            out.append((keys[:cut] + tuple(next(self.fresh) for _ in range(extra)))[:256])
        return out

    def completions(self, n: int, size: int = 16) -> list[tuple[int, list[Item]]]:
        """``n`` batches: a holder of a conversation stores ``size`` new blocks after it."""
        rng, out = self.rng, []
        for _ in range(n):
            keys, holders = self.conversations[rng.randrange(len(self.conversations))]
            longer = keys + tuple(next(self.fresh) for _ in range(size))
            out.append((rng.choice(holders), chain(longer, start=len(keys))))
        return out


def percentiles(lat_ns: list[int]) -> dict[str, float]:
    lat = sorted(lat_ns)
    return {
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e3,
        "mean_us": sum(lat) / len(lat) / 1e3,
    }


def time_calls(
    fn: Callable[..., Any], calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]
) -> list[int]:
    """Wall-clock ns of ``fn(*args, **kwargs)`` for each call, one at a time."""
    clock = time.perf_counter_ns
    lat = []
    for args, kwargs in calls:
        t0 = clock()
        fn(*args, **kwargs)
        lat.append(clock() - t0)
    return lat


def evalsha_usec(client: redis.Redis) -> float | None:
    """The server's mean µs per EVALSHA since the last CONFIG RESETSTAT (None: not allowed)."""
    try:
        stats = client.info("commandstats")
    except redis.RedisError:
        return None
    entry = stats.get("cmdstat_evalsha")
    return float(entry["usec_per_call"]) if entry else None


def reset_stats(client: redis.Redis) -> bool:
    try:
        client.config_resetstat()
        return True
    except redis.RedisError:
        return False


def one_pass(
    stores: dict[str, TrieStore],
    index: Index,
    requests: list[tuple[int, ...]],
    batches: int,
    client: redis.Redis,
) -> dict[str, dict[str, Any]]:
    """One timed pass of every path over both stores."""
    out: dict[str, dict[str, Any]] = {}
    # Correctness first (untimed): the two stores must agree on every request.
    mem, red = stores["memory"], stores["redis"]
    for keys in requests[:200]:
        assert dict(red.matched_blocks(keys)) == dict(mem.matched_blocks(keys)), "stores disagree"
    completions = index.completions(batches)
    for name, store in stores.items():
        figures: dict[str, Any] = {}
        stats = name == "redis" and reset_stats(client)
        figures["matched_blocks"] = percentiles(
            time_calls(store.matched_blocks, [((keys,), {}) for keys in requests])
        )
        if stats:
            figures["matched_blocks"]["server_us"] = evalsha_usec(client)
        stats = name == "redis" and reset_stats(client)
        figures["apply_store"] = percentiles(
            time_calls(store.apply, [((w, batch), {}) for w, batch in completions])
        )
        if stats:
            figures["apply_store"]["server_us"] = evalsha_usec(client)
        stats = name == "redis" and reset_stats(client)
        figures["apply_remove"] = percentiles(
            time_calls(
                store.apply,
                [((w,), {"removed": [k for k, _, _ in batch]}) for w, batch in completions],
            )
        )
        if stats:
            figures["apply_remove"]["server_us"] = evalsha_usec(client)
        out[name] = figures
    out["ping"] = percentiles(time_calls(client.ping, [((), {})] * 1000))
    return out


def median_of(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per store, path and figure: the median over the passes."""

    def med(path: tuple[str, ...]) -> float | None:
        values = []
        for p in passes:
            v: Any = p
            for key in path:
                v = v.get(key) if isinstance(v, dict) else None
            if v is not None:
                values.append(v)
        return statistics.median(values) if values else None

    out: dict[str, Any] = {}
    first = passes[0]
    for store, paths in first.items():
        if store == "ping":
            out["ping"] = {k: med(("ping", k)) for k in paths}
            continue
        out[store] = {
            path: {k: med((store, path, k)) for k in figs} for path, figs in paths.items()
        }
    return out


def _with_parent_death(cmd: list[str]) -> list[str]:
    """``cmd`` run so that it gets SIGKILL when the process that started it dies (Linux,
    util-linux ``setpriv``), so a killed test run leaves no redis-server behind. No
    ``preexec_fn``: Python code in a child forked from a process with gRPC threads can
    crash it (seen: SIGSEGV)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *cmd] if setpriv else cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def own_redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port (no persistence); its URL."""
    binary = os.environ.get("VERTUMNUS_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        sys.exit(
            "redis-server not found: install Debian's package (apt-get install redis-server) "
            "or pass --redis-url"
        )
    with tempfile.TemporaryDirectory(prefix="vt-bench-redis-") as tmp:
        port = free_port()
        conf = Path(tmp) / "redis.conf"
        conf.write_text(
            f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {tmp}\nloglevel warning\n'
        )
        proc = subprocess.Popen(
            _with_parent_death([binary, str(conf)]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            probe = redis.Redis(port=port, socket_connect_timeout=0.2)
            deadline = time.monotonic() + 10
            while True:
                try:
                    probe.ping()
                    break
                except redis.ConnectionError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        sys.exit(f"redis-server did not start on port {port}")
                    time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=100_000, help="blocks in the index")
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2000, help="matched_blocks calls per pass")
    ap.add_argument("--batches", type=int, default=500, help="apply batches per pass")
    ap.add_argument("--repeat", type=int, default=5, help="passes; figures are their medians")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--redis-url",
        help="use this server instead of starting one (a namespace of "
        "its own is created and deleted)",
    )
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)

    with own_redis_server() if args.redis_url is None else _given(args.redis_url) as url:
        client = redis_client(url, socket_timeout=30.0, client_name="vertumnus-bench")
        namespace = f"bench/store-speed-{os.getpid()}"
        red = RedisTrieStore(client, namespace)
        stores: dict[str, TrieStore] = {"memory": PrefixTrie(namespace), "redis": red}
        try:
            index = Index(args.blocks, args.workers, args.seed)
            build_s = {}
            for name, store in stores.items():
                t0 = time.perf_counter()
                for w, items in index.events():
                    store.apply(w, items)
                build_s[name] = time.perf_counter() - t0
            assert len(stores["redis"]) == len(stores["memory"])
            requests = index.requests(args.requests)
            lengths = sorted(len(r) for r in requests)
            print(
                f"index: {len(stores['memory'])} blocks, {len(index.heads)} heads, "
                f"{len(index.conversations)} conversations on {args.workers} workers; built in "
                + ", ".join(f"{n} {s:.1f} s" for n, s in build_s.items()),
                file=sys.stderr,
            )
            passes = []
            for i in range(args.repeat):
                passes.append(one_pass(stores, index, requests, args.batches, client))
                print(f"pass {i + 1}/{args.repeat} done", file=sys.stderr)
        finally:
            if args.redis_url is not None:
                keys = list(client.scan_iter(match=red.key_prefix + "*", count=1000))
                for i in range(0, len(keys), 1000):
                    client.unlink(*keys[i : i + 1000])

    med = median_of(passes)
    ratios = {
        path: {
            k: med["redis"][path][k] / med["memory"][path][k]
            for k in ("p50_us", "p99_us", "mean_us")
        }
        for path in ("matched_blocks", "apply_store", "apply_remove")
    }
    report = {
        "config": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "index_blocks": len(stores["memory"]),
            "request_blocks": {
                "min": lengths[0],
                "p50": lengths[len(lengths) // 2],
                "max": lengths[-1],
            },
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "build_s": build_s,
        "median": med,
        "ratio_redis_over_memory": ratios,
        "passes": passes,
    }
    print(f"\nmedian of {args.repeat} passes (wall clock, µs per call)")
    print(f"{'path':<16}{'store':<8}{'p50':>10}{'p99':>10}{'mean':>10}{'server':>10}")
    for path in ("matched_blocks", "apply_store", "apply_remove"):
        for name in ("memory", "redis"):
            f = med[name][path]
            server = f.get("server_us")
            print(
                f"{path:<16}{name:<8}{f['p50_us']:>10.1f}{f['p99_us']:>10.1f}{f['mean_us']:>10.1f}"
                f"{'' if server is None else f'{server:>10.1f}'}"
            )
        r = ratios[path]
        print(f"{'':<16}{'ratio':<8}{r['p50_us']:>9.0f}x{r['p99_us']:>9.0f}x{r['mean_us']:>9.0f}x")
    p = med["ping"]
    print(f"{'PING':<16}{'redis':<8}{p['p50_us']:>10.1f}{p['p99_us']:>10.1f}{p['mean_us']:>10.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    raise SystemExit(main())
