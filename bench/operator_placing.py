"""What placing a large pool costs: its status writes from ``kubectl apply`` to Ready.

The pool's loop steps when a domain pod changes (the operator watches them), and a step
writes the status when what it observed changed. A pool of many domain pods sends many
pod events while it is placed; this counts the status writes (``PATCH cppools/status``,
which only the operator makes, from the API server's own counter) and the time to Ready
of ``--gpus`` GPUs in domain pods of 8 on kwok nodes, ``--runs`` pools one after the
other::

    python bench/operator_placing.py [--gpus 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_api_load import _requests  # noqa: E402
from operator_e2e import bench_cluster, kc, ops  # noqa: E402  (the e2e helpers, loaded by path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=256, help="GPUs of the pool, a multiple of 8")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()
    if args.gpus < 8 or args.gpus % 8 or args.runs < 1:
        p.error("--gpus must be a positive multiple of 8 and --runs >= 1")
    if kc.missing_binaries():
        print(f"missing {kc.missing_binaries()}: run bash e2e/k8s/build.sh", file=sys.stderr)
        return 2
    domains = args.gpus // 8
    rows = []
    with bench_cluster(domains, "place") as (cluster, kubeconfig, tmpd):
        operator = ops.OperatorProcess(kubeconfig, tmpd / "operator.log", priority=10, name="b")
        with operator:
            time.sleep(2.0)  # the operator's start-up
            for i in range(args.runs):
                name = f"big{i}"
                composition = [{"count": domains, "degree": 8}]
                before, began = _requests(cluster), time.monotonic()
                ops.apply(cluster, ops.cppool(name, "bench", args.gpus, composition=composition))
                ops.wait_for(
                    "Ready",
                    120,
                    lambda n=name: ops.pool_status(cluster, "bench", n).get("phase") == "Ready",
                    interval=0.02,
                )
                took = time.monotonic() - began
                writes = (
                    _requests(cluster)["PATCH", "cppools/status"]
                    - before["PATCH", "cppools/status"]
                )
                rows.append({"ready_s": took, "status_writes": writes})
                print(
                    f"{name}: {args.gpus} GPUs ({domains} domain pods) Ready in {took:.2f} s, "
                    f"{writes:.0f} status writes",
                    flush=True,
                )
                cluster.kubectl("delete", "cppool", name, "-n", "bench", "--timeout=120s")
                ops.wait_for(
                    "pods gone", 120, lambda n=name: not ops.engine_pods(cluster, "bench", n)
                )
    ready = statistics.median(r["ready_s"] for r in rows)
    writes = statistics.median(r["status_writes"] for r in rows)
    print(f"median of {args.runs}: Ready in {ready:.2f} s, {writes:.0f} status writes")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "gpus": args.gpus,
                    "domain_pods": domains,
                    "runs": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
