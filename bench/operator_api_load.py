"""What idle pools cost the API server: requests per second per pool, by verb and resource.

Starts the real control plane (``e2e/k8s``), installs the chart, runs the operator as a
process with ``--pools`` pools of 16 GPUs on kwok nodes, each Ready and idle (its
controller reading the stand-in router's steady window every hop), and counts the
``apiserver_request_total`` the API server reports over ``--seconds`` (every client:
the operator's share is the part that grows with the pools), and beside it the
operator's own count (``vertumnus_operator_api_requests_total``, where the operator
exports it), and what the status writes carry: each pool's CPPool as JSON, times its
PATCHes of the status per second, is what etcd stores and every CPPool watcher receives.
``--window`` sets the pools' ``controller.windowSeconds`` (the default 20 s looks every
2.5 s); ``--record-looks-every`` is the operator's flag of that name (by its environment
variable, which an older checkout ignores)::

    python bench/operator_api_load.py [--pools 4] [--seconds 30] [--window 20] [--record-looks-every S]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_e2e import bench_cluster, kc, ops  # noqa: E402  (the e2e helpers, loaded by path)

from vertumnus.ports import free_port_base  # noqa: E402

_SAMPLE = re.compile(r'(\w+)="([^"]*)"')


def _requests(cluster) -> collections.Counter[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """apiserver_request_total by (verb, resource[/subresource]), summed over the rest."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(_SAMPLE.findall(line))
            resource = "/".join(x for x in (labels.get("resource"), labels.get("subresource")) if x)
            out[labels.get("verb", ""), resource] += float(line.rsplit(" ", 1)[1])
    return out


def _own(operator) -> collections.Counter[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """The operator's own requests so far, by (verb, resource) (empty: not exported)."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for (name, labels), v in operator.scrape().items():
        if name == "vertumnus_operator_api_requests_total":
            at = dict(labels)
            out[at["verb"], at["resource"]] += v
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pools", type=int, default=4)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--window", type=int, default=20, help="controller.windowSeconds of the pools")
    p.add_argument(
        "--record-looks-every",
        default=None,
        metavar="SECONDS",
        help="the operator's --record-looks-every (default: the operator's default)",
    )
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()
    if args.pools < 1 or args.seconds <= 0:
        p.error("--pools must be >= 1 and --seconds > 0")
    if kc.missing_binaries():
        print(f"missing {kc.missing_binaries()}: run bash e2e/k8s/build.sh", file=sys.stderr)
        return 2
    fake = ops.load_fake_router()
    with bench_cluster(2 * args.pools, "idle") as (cluster, kubeconfig, tmpd):
        operator = ops.OperatorProcess(
            kubeconfig,
            tmpd / "operator.log",
            priority=10,
            name="b",
            metrics_port=free_port_base(1),
            env=(
                {}
                if args.record_looks_every is None
                else {"VERTUMNUS_RECORD_LOOKS_EVERY": args.record_looks_every}
            ),
        )
        with operator, fake.FakeRouter() as router:
            router.set_demand(0.5, 10)  # a light, steady window: no transition
            for i in range(args.pools):
                pool = ops.cppool(
                    f"idle{i}",
                    "bench",
                    16,
                    controller={"windowSeconds": args.window, "checksPerWindow": 8},
                )
                pool["metadata"]["annotations"] = {"vertumnus.io/router-addresses": router.address}
                ops.apply(cluster, pool)
            for i in range(args.pools):
                ops.wait_for(
                    "Ready",
                    60,
                    lambda i=i: (
                        ops.pool_status(cluster, "bench", f"idle{i}").get("phase") == "Ready"
                    ),
                )
            time.sleep(5.0)  # past the pools' start
            before, own_before = _requests(cluster), _own(operator)
            began = time.monotonic()
            time.sleep(args.seconds)
            after, own_after = _requests(cluster), _own(operator)
            took = time.monotonic() - began
            sizes = [
                len(
                    cluster.kubectl("get", "cppool", f"idle{i}", "-n", "bench", "-o", "json").stdout
                )
                for i in range(args.pools)
            ]
    rates = {k: (after[k] - before[k]) / took for k in after if after[k] > before[k]}
    total = sum(rates.values())
    print(
        f"{args.pools} idle pools (windowSeconds {args.window}), {took:.0f} s: "
        f"{total:.1f} API requests/s in all, {total / args.pools:.2f} per pool"
    )
    for (verb, resource), r in sorted(rates.items(), key=lambda kv: -kv[1]):
        if r >= 0.05:
            print(f"  {r:6.2f}/s  {verb} {resource}")
    own = {
        k: (own_after[k] - own_before[k]) / took for k in own_after if own_after[k] > own_before[k]
    }
    if own_after:
        print(f"the operator's own: {sum(own.values()) / args.pools:.2f} requests/s per pool")
        for (verb, resource), r in sorted(own.items(), key=lambda kv: -kv[1]):
            print(f"  {r / args.pools:6.2f}/s per pool  {verb} {resource}")
    else:
        print("the operator's own: not exported by this checkout")
    size = sum(sizes) / len(sizes)
    writes = rates.get(("PATCH", "cppools/status"), 0.0) / args.pools
    print(
        f"a CPPool is {size / 1000:.1f} kB as JSON; {writes:.3f} status writes/s per pool: "
        f"{size * writes / 1000:.2f} kB/s per pool into etcd and to every CPPool watcher"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "pools": args.pools,
                    "window_s": args.window,
                    "seconds": took,
                    "per_pool": total / args.pools,
                    "by_request": {f"{v} {r}": x for (v, r), x in rates.items()},
                    "operator_per_pool": (sum(own.values()) / args.pools) if own_after else None,
                    "operator_by_request": {f"{v} {r}": x for (v, r), x in own.items()},
                    "record_looks_every": args.record_looks_every,
                    "cppool_bytes": size,
                    "status_writes_per_pool_s": writes,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
