"""Operator timings on a real control plane: a 64-GPU pool to Ready, and transitions.

Starts the project's own control plane (``e2e/k8s``: kube-apiserver 1.37 with native gang
scheduling, scheduler, controller-manager, kwok) in a temporary directory, installs the
Helm chart, runs the operator as a real process under the chart's ServiceAccount, adds 8
fake nodes of 8 GPUs, and measures:

1. **apply → Ready**: from ``kubectl apply`` of a 64-GPU CPPool (8 domain pods, one gang)
   to ``status.phase == Ready`` as a client polling every 20 ms sees it (target ≤ 30 s),
   over ``--pools`` pools created and deleted one after the other;
2. **transitions**: ``--transitions`` splits and merges of one domain (a pinned
   composition alternating between 8xCP8 and 2xCP4+7xCP8), the stand-in router on real
   gRPC holding each drain for ``--drain`` seconds. Reported per transition, from the
   operator's own record (``status.lastTransition``: drain, switch = all drained →
   commit recorded) and from outside: the time from the stand-in router answering the
   last Drain to a client seeing the commit in the status (target ≤ 5 s excluding the
   drain), and from the spec patch to the commit;
3. **a rolling update**: a new engine image on that pool, from the patch to all 8 domain
   pods replaced and the pool Ready, and per domain from its first drain to its workers
   resumed (each drain held ``--drain`` seconds).

Needs the binaries of ``bash e2e/k8s/build.sh`` and the ``operator`` extra. Writes JSON
(``--out``, default ``bench-out/operator_e2e.json``). Run::

    python bench/operator_e2e.py            # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kc = _load("e2e_k8s_cluster", ROOT / "e2e" / "k8s" / "cluster.py")
ops = _load("e2e_operator_support", ROOT / "e2e" / "operator_support.py")

PINNED_A = [{"count": 8, "degree": 8}]
PINNED_B = [{"count": 2, "degree": 4}, {"count": 7, "degree": 8}]


@contextlib.contextmanager
def bench_cluster(nodes: int, prefix: str) -> Iterator[tuple[Any, Path, Path]]:
    """A real control plane (``e2e/k8s``) with the chart installed, ``nodes`` kwok nodes
    of 8 GPUs and the namespace ``bench``: (cluster, the operator's kubeconfig, a
    scratch folder), all gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="vertumnus-bench-") as tmp:
        tmpd = Path(tmp)
        cluster = kc.Cluster(tmpd / "k8s")
        cluster.start()
        try:
            kubeconfig = ops.install_chart(cluster, tmpd / "helm")
            cluster.add_gpu_nodes(nodes, gpus=8, prefix=prefix)
            cluster.kubectl("create", "namespace", "bench")
            ops.wait_for(
                "the default ServiceAccount",
                30,
                lambda: (
                    cluster.kubectl("get", "sa", "default", "-n", "bench", check=False).returncode
                    == 0
                ),
            )
            yield cluster, kubeconfig, tmpd
        finally:
            cluster.stop()


def _summary(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def _poll(what: str, timeout: float, probe: Any) -> Any:
    return ops.wait_for(what, timeout, probe, interval=0.02)


def _roll(cluster: Any, router: Any, name: str, drain_s: float) -> dict[str, Any]:
    """A new engine image on the pool: from the patch to every domain pod replaced and
    the pool Ready again, and per domain from its first drain to its workers resumed."""
    drains_before, resumes_before = len(router.drains), len(router.resumes)
    began = time.monotonic()
    wall_began = time.time()
    ops.set_engine_image(cluster, "bench", name)
    _poll("the rolling update", 300, lambda: ops.rolled_to(cluster, "bench", name))
    total = time.monotonic() - began
    st = ops.pool_status(cluster, "bench", name)
    domain_of = {w["id"]: w["domain"] for w in st["workers"]}
    per_domain = []
    for d in sorted(set(domain_of.values())):
        first = min(t for w, t in router.drains[drains_before:] if domain_of.get(w) == d)
        resumed = max(t for w, t in router.resumes[resumes_before:] if domain_of.get(w) == d)
        per_domain.append(resumed - first)
    print(
        f"rolling update of 8 domain pods: {total:.2f} s; per domain, first drain to resumed: "
        f"median {statistics.median(per_domain):.2f} s (each drain held {drain_s} s)",
        flush=True,
    )
    return {
        "domain_pods": 8,
        "drain_held_s": drain_s,
        "patch_to_ready_s": total,
        "patch_to_first_drain_s": min(t for _, t in router.drains[drains_before:]) - wall_began,
        "per_domain_drain_to_resumed_s": {**_summary(per_domain), "values": per_domain},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pools", type=int, default=3, help="64-GPU pools timed to Ready (default 3)")
    p.add_argument("--transitions", type=int, default=12, help="transitions timed (default 12)")
    p.add_argument(
        "--drain", type=float, default=0.3, help="seconds the stand-in router holds a drain"
    )
    p.add_argument("--out", default=str(ROOT / "bench-out" / "operator_e2e.json"))
    args = p.parse_args()
    if kc.missing_binaries():
        print(f"missing {kc.missing_binaries()}: run bash e2e/k8s/build.sh", file=sys.stderr)
        return 2
    fake = ops.load_fake_router()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "kubernetes": kc.K8S_VERSION,
    }
    with bench_cluster(8, "bench") as (cluster, kubeconfig, tmpd):
        operator = ops.OperatorProcess(kubeconfig, tmpd / "operator.log", priority=10, name="bench")
        with operator, fake.FakeRouter(drain_delay_s=args.drain) as router:
            time.sleep(2.0)  # the operator's start-up is not part of a pool's time to Ready
            ready = []
            for i in range(args.pools):
                name = f"pool{i}"
                pool = ops.cppool(name, "bench", 64, composition=PINNED_A)
                began = time.monotonic()
                ops.apply(cluster, pool)
                _poll(
                    "Ready",
                    60,
                    lambda n=name: ops.pool_status(cluster, "bench", n).get("phase") == "Ready",
                )
                ready.append(time.monotonic() - began)
                print(f"{name}: 64 GPUs Ready in {ready[-1]:.2f} s", flush=True)
                if i < args.pools - 1:
                    cluster.kubectl("delete", "cppool", name, "-n", "bench", "--timeout=60s")
                    _poll("pods gone", 60, lambda n=name: not ops.engine_pods(cluster, "bench", n))
            result["apply_to_ready_s"] = {
                **_summary(ready),
                "values": ready,
                "gpus": 64,
                "domain_pods": 8,
            }

            name = f"pool{args.pools - 1}"
            cluster.kubectl(
                "annotate",
                "cppool",
                name,
                "-n",
                "bench",
                "--overwrite",
                f"vertumnus.io/router-addresses={router.address}",
            )
            rows = []
            for k in range(args.transitions):
                target = PINNED_B if k % 2 == 0 else PINNED_A
                epoch = ops.pool_status(cluster, "bench", name)["epoch"]
                drains_before = len(router.drains)
                patched = time.monotonic()
                patch = json.dumps({"spec": {"composition": target}})
                cluster.kubectl("patch", "cppool", name, "-n", "bench", "--type=merge", "-p", patch)
                wall_patched = time.time()

                def committed(e=epoch):
                    st = ops.pool_status(cluster, "bench", name)
                    return st if st.get("epoch") == e + 1 and not st.get("transitions") else None

                st = _poll("the commit", 60, committed)
                seen = time.monotonic()
                wall_seen = time.time()
                drains = router.drains[drains_before:]
                # The stand-in answers a drain drain_s after the call arrived.
                drained_wall = max(t for _, t in drains) + args.drain
                last = st["lastTransition"]
                rows.append(
                    {
                        "kind": last["kind"],
                        "epoch": last["epoch"],
                        "operator_drain_s": last["drainSeconds"],
                        "operator_switch_s": last["switchSeconds"],
                        "operator_total_s": last["totalSeconds"],
                        "observed_after_drain_s": wall_seen - drained_wall,
                        "observed_patch_to_commit_s": seen - patched,
                        "patch_to_first_drain_s": min(t for _, t in drains) - wall_patched,
                    }
                )
                print(
                    f"transition {k + 1}: {last['kind']:5s} drain {last['drainSeconds']:.3f} s, "
                    f"switch {last['switchSeconds']:.3f} s; seen {rows[-1]['observed_after_drain_s']:.3f} s "
                    "after the drain",
                    flush=True,
                )
            result["transitions"] = {
                "n": len(rows),
                "drain_held_s": args.drain,
                "switch_excluding_drain_s": _summary([r["operator_switch_s"] for r in rows]),
                "observed_after_drain_s": _summary([r["observed_after_drain_s"] for r in rows]),
                "patch_to_commit_s": _summary([r["observed_patch_to_commit_s"] for r in rows]),
                "rows": rows,
            }
            result["router_switches_applied"] = len(router.applied)
            try:
                result["rolling_update"] = _roll(cluster, router, name, args.drain)
            except AssertionError:
                # What the operator saw: the timeout alone says nothing.
                print(f"status: {json.dumps(ops.pool_status(cluster, 'bench', name))}")
                print("the operator's log, last 80 lines:")
                print("\n".join(operator.log().splitlines()[-80:]), flush=True)
                raise
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    r, t = result["apply_to_ready_s"], result["transitions"]
    print(
        f"apply -> Ready (64 GPUs): median {r['median']:.2f} s, max {r['max']:.2f} s (target <= 30 s)"
    )
    print(
        f"transition excluding drain: median {t['switch_excluding_drain_s']['median']:.3f} s, "
        f"max {t['switch_excluding_drain_s']['max']:.3f} s; seen by a client "
        f"{t['observed_after_drain_s']['median']:.3f} s after the drain (target <= 5 s)"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
