"""Reconfiguration under load in the local pool: drain and switch seconds, nothing lost (issue 10).

    python bench/reconfig_local.py [--transitions 20] [--trace PATH|synthetic]
        [--rate-scale 6] [--requests 1200] [--json OUT]

``vertumnus up --no-controller`` runs the default pool (8 CPU ranks as
``2xCP2+1xCP4``); ``vertumnus load`` replays a scaled trace through it
(real gRPC clients, every request recorded); meanwhile this script asks the
router's Admin API to split the CP4 worker into two CP2 workers and merge
them back, again and again (``--transitions`` in all, one every
``--gap`` seconds), as ``vertumnus admin split|merge`` would.

Reported: per transition its drain seconds (stop admitting, re-place the
queue, wait for the running prefill), switch seconds (the ranks regroup into
the new epoch) and end-to-end seconds as the caller saw them; medians and
maxima for splits and merges; and what the load saw: requests sent,
completed, failed, rejected, and whether any request id was answered twice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
sys.path.insert(0, str(ROOT / "bench"))

from sim_to_real import _cli, _free_base  # noqa: E402  (one port helper for the benches)


def _transitions(target: str, count: int, gap: float, log: list[dict[str, object]]) -> None:
    import grpc

    from vertumnus._proto import pool_pb2, pool_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        admin = pool_pb2_grpc.AdminStub(ch)
        pool = admin.GetPool(pool_pb2.GetPoolRequest(), timeout=10)
        big = max(pool.workers, key=lambda w: w.degree).worker
        halves: list[int] = []
        for i in range(count):
            time.sleep(gap)
            t0 = time.perf_counter()
            if i % 2 == 0:
                rep = admin.Reconfigure(pool_pb2.ReconfigureRequest(split=big), timeout=120)
                halves = list(rep.added)
                kind = "split"
            else:
                a, b = halves
                rep = admin.Reconfigure(
                    pool_pb2.ReconfigureRequest(merge=pool_pb2.MergePair(a=a, b=b)), timeout=120
                )
                (big,) = rep.added
                kind = "merge"
            log.append(
                {
                    "kind": kind,
                    "drain_s": rep.drain_seconds,
                    "switch_s": rep.switch_seconds,
                    "end_to_end_s": time.perf_counter() - t0,
                    "epoch": rep.epoch,
                    "added": list(rep.added),
                }
            )
            print(
                f"{kind} {i + 1}/{count}: drain {1e3 * rep.drain_seconds:.1f} ms, "
                f"switch {1e3 * rep.switch_seconds:.1f} ms, epoch {rep.epoch}",
                file=sys.stderr,
            )


def _summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "max": max(xs), "min": min(xs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--transitions", type=int, default=20)
    ap.add_argument("--gap", type=float, default=1.5, help="seconds between transitions")
    ap.add_argument("--trace", default=str(MOONCAKE) if MOONCAKE.exists() else "synthetic")
    ap.add_argument("--rate-scale", type=float, default=6.0)
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="reconfig-local-"))
    port, engine_port = _free_base(1), _free_base(16)
    up = subprocess.Popen(
        _cli(
            "up",
            "--no-controller",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--engine-port",
            str(engine_port),
            "--log-format",
            "json",
        ),
        stdout=subprocess.PIPE,
        stderr=(tmp / "up.log").open("wb"),
    )
    target = f"127.0.0.1:{port}"
    try:
        assert up.stdout is not None
        while "connect:" not in (line := up.stdout.readline().decode()):
            if not line and up.poll() is not None:
                raise SystemExit(f"vertumnus up exited; see {tmp / 'up.log'}")
        load_json = tmp / "load.json"
        load = subprocess.Popen(
            _cli(
                "load",
                "--target",
                target,
                "--trace",
                args.trace,
                "--rate-scale",
                str(args.rate_scale),
                "--requests",
                str(args.requests),
                "--records",
                "--no-progress",
                "--json",
                str(load_json),
            )
        )
        log: list[dict[str, object]] = []
        worker = threading.Thread(
            target=_transitions, args=(target, args.transitions, args.gap, log), daemon=True
        )
        worker.start()
        worker.join()
        load_rc = load.wait()
    finally:
        up.send_signal(2)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
    report = json.loads(load_json.read_text())
    s = report["summary"]
    ids = [r["id"] for r in report["records"]]
    out: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d"),
        "pool": "2xCP2+1xCP4 on 8 CPU ranks (vertumnus up defaults)",
        "trace": args.trace,
        "rate_scale": args.rate_scale,
        "transitions": log,
        "load": {
            "sent": s["sent"],
            "completed": s["completed"],
            "failed": s["failed"],
            "rejected": s["rejected"],
            "answered_twice": len(ids) - len(set(ids)),
            "load_exit_code": load_rc,
            "mean_ttft_s": s["mean_ttft_s"],
            "p90_ttft_s": s["p90_ttft_s"],
        },
    }
    for kind in ("split", "merge"):
        rows = [t for t in log if t["kind"] == kind]
        if rows:
            out[kind] = {
                k: _summary([float(t[k]) for t in rows])  # type: ignore[arg-type]
                for k in ("drain_s", "switch_s", "end_to_end_s")
            }
    load_out = out["load"]
    assert isinstance(load_out, dict)
    print(
        f"{len(log)} transitions under load; load: {load_out['completed']}/{load_out['sent']} completed, "
        f"{load_out['failed']} failed, {load_out['rejected']} rejected, {load_out['answered_twice']} answered twice"
    )
    for kind in ("split", "merge"):
        k = out.get(kind)
        if isinstance(k, dict):
            print(
                f"  {kind}: drain median {1e3 * k['drain_s']['median']:.1f} ms (max {1e3 * k['drain_s']['max']:.1f}), "
                f"switch median {1e3 * k['switch_s']['median']:.1f} ms (max {1e3 * k['switch_s']['max']:.1f}), "
                f"end to end median {1e3 * k['end_to_end_s']['median']:.1f} ms (max {1e3 * k['end_to_end_s']['max']:.1f})"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if load_out["failed"] == 0 and load_out["answered_twice"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
