"""Sim-to-real: one scaled trace through a real local pool and through the simulator (issue 10).

    python bench/sim_to_real.py [--composition 2xCP1 --ranks 2] [--trace PATH|synthetic]
        [--rate-scale 12] [--requests 1500] [--length-scale 0.03125] [--profile cpu-tiny]
        [--json OUT]

Both sides use the project's own commands on the same requests:

1. ``vertumnus up --composition C --ranks R --no-controller`` starts CPU engines
   of the tiny model and the router (cost-model placement, cache manager);
2. ``vertumnus load --trace T --rate-scale X --requests N --length-scale L``
   replays the trace through real gRPC clients and records each request;
3. ``vertumnus simulate`` replays the same scaled requests (``--length-scale``,
   ``--max-tokens``, ``--requests`` apply the same :func:`scale_lengths`) with
   ``vertumnus:C`` on ``R`` GPUs, the same profile (measured on this machine by
   ``vertumnus profile`` and fitted by ``vertumnus fit``), the engines' cache
   size, and ``--t-ext`` set to the pool's fixed per-request overhead, measured
   first on the idle pool (client TTFT of one-block requests minus the profile's
   prediction for them: the gRPC hops client → router → engine, which the
   profile, timed inside the engine, does not contain).

Reported: mean / P50 / P90 / P99 TTFT of both and their ratios, token hit rates,
and the share of requests the router and the simulator placed on the same worker.
The CPU ranks of the default composition match the machine's cores one to one:
a pool with more ranks than cores runs ranks time-shared, which no GPU pool does
and the profile (one worker at a time) does not contain — ``--composition
2xCP2+1xCP4 --ranks 8`` shows how far that moves the real side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vertumnus.ports import free_port_base as _free_base

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "vertumnus", *args]


def _start_pool(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_base(1)
    engine_port = _free_base(args.ranks * 2)
    cmd = _cli(
        "up",
        "--composition",
        args.composition,
        "--ranks",
        str(args.ranks),
        "--no-controller",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--engine-port",
        str(engine_port),
        "--profile",
        args.profile,
        "--log-format",
        "json",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("wb"))
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"vertumnus up exited ({proc.returncode}); see {log}")
        if "connect:" in line:
            return proc, f"127.0.0.1:{port}"
    proc.kill()
    raise RuntimeError(f"vertumnus up did not start in 300 s; see {log}")


async def _idle_overhead(target: str, model, block: int, n: int = 30) -> float:  # type: ignore[no-untyped-def]
    """Median of (client TTFT − predicted execution) over one-block requests sent one
    at a time to the idle pool: the fixed cost of the two gRPC hops."""
    import random

    import grpc

    from vertumnus._proto import pool_pb2, pool_pb2_grpc

    rng = random.Random(7)
    gaps = []
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pool_pb2_grpc.PrefillStub(ch)
        for i in range(n):
            toks = [rng.randrange(256) for _ in range(block)]
            t0 = time.perf_counter()
            reply = await stub.Prefill(
                pool_pb2.PrefillRequest(request_id=f"probe-{i}", token_ids=toks), timeout=30
            )
            ttft = time.perf_counter() - t0
            gaps.append(ttft - model.predict(reply.degree, block, 0))
            await asyncio.sleep(0.05)
    return max(0.0, statistics.median(gaps[5:]))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _stats(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "p50": _pct(xs, 0.5),
        "p90": _pct(xs, 0.9),
        "p99": _pct(xs, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--composition", default="2xCP1")
    ap.add_argument("--ranks", type=int, default=2, help="CPU ranks per engine")
    ap.add_argument("--trace", default=str(MOONCAKE) if MOONCAKE.exists() else "synthetic")
    ap.add_argument("--rate-scale", type=float, default=12.0)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--length-scale", type=float, default=1 / 32)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument(
        "--cache-blocks-per-gpu", type=int, default=1024, help="the engines' --num-blocks"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--t-ext", type=float, default=None, help="skip the idle probe; use this")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from vertumnus.core.types import Composition
    from vertumnus.profiles import load_model

    model = load_model(args.profile)
    gpus = Composition.parse(args.composition).gpus
    tmp = Path(tempfile.mkdtemp(prefix="sim-to-real-"))
    load_json, sim_json = tmp / "real.json", tmp / "sim.json"
    shape = [
        "--trace",
        args.trace,
        "--seed",
        str(args.seed),
        "--rate-scale",
        str(args.rate_scale),
        "--requests",
        str(args.requests),
        "--length-scale",
        str(args.length_scale),
        "--max-tokens",
        str(args.max_tokens),
    ]

    proc, target = _start_pool(args, tmp / "up.log")
    try:
        block = max(1, round(512 * args.length_scale))
        t_ext = args.t_ext
        if t_ext is None:
            t_ext = asyncio.run(_idle_overhead(target, model, block))
        print(
            f"pool {args.composition} at {target}; fixed overhead (T_ext) {1e3 * t_ext:.2f} ms",
            file=sys.stderr,
        )
        t0 = time.perf_counter()
        subprocess.run(
            _cli(
                "load",
                "--target",
                target,
                *shape,
                "--records",
                "--no-progress",
                "--json",
                str(load_json),
            ),
            check=True,
        )
        real_wall = time.perf_counter() - t0
    finally:
        proc.send_signal(2)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    subprocess.run(
        _cli(
            "simulate",
            *shape,
            "--gpus",
            str(gpus),
            "--compare",
            f"vertumnus:{args.composition}",
            "--profile",
            args.profile,
            "--cache-blocks-per-gpu",
            str(args.cache_blocks_per_gpu),
            "--t-ext",
            str(t_ext),
            "--no-progress",
            "--json",
            str(sim_json),
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )

    real = json.loads(load_json.read_text())
    sim_doc = json.loads(sim_json.read_text())
    (sim,) = sim_doc["policies"].values()
    recs = [r for r in real["records"] if "ttft_s" in r]
    real_ttft = _stats([r["ttft_s"] for r in recs])
    sim_ttft = {
        k: sim[f"{k}_ttft_s"] for k in ("mean", "p50", "p90", "p99") if f"{k}_ttft_s" in sim
    }
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "composition": args.composition,
        "ranks": args.ranks,
        "cpus": len(os.sched_getaffinity(0)),
        "trace": args.trace,
        "rate_scale": args.rate_scale,
        "requests": args.requests,
        "length_scale": args.length_scale,
        "profile": args.profile,
        "t_ext_s": t_ext,
        "real": {
            "completed": real["summary"]["completed"],
            "failed": real["summary"]["failed"],
            "rejected": real["summary"]["rejected"],
            "ttft_s": real_ttft,
            "token_hit_rate": real["summary"]["token_hit_rate"],
            "wall_s": real_wall,
            "mean_execution_s": statistics.fmean(r["execution_s"] for r in recs),
            "mean_predicted_s": statistics.fmean(r["predicted_s"] for r in recs),
        },
        "sim": {
            "requests": sim["requests"],
            "ttft_s": sim_ttft,
            "token_hit_rate": sim["token_hit_rate"],
        },
        "sim_over_real": {k: sim_ttft[k] / real_ttft[k] for k in sim_ttft},
    }
    r, s = out["real"], out["sim"]
    print(
        f"{args.composition} ({args.ranks} ranks, {out['cpus']} CPUs), {args.requests} requests at rate x{args.rate_scale:g}:\n"
        f"  real: {r['completed']} completed, {r['failed']} failed, {r['rejected']} rejected; "
        f"TTFT mean {1e3 * real_ttft['mean']:.1f} ms, P90 {1e3 * real_ttft['p90']:.1f} ms; hit rate {r['token_hit_rate']:.3f}; "
        f"execution mean {1e3 * r['mean_execution_s']:.1f} ms vs predicted {1e3 * r['mean_predicted_s']:.1f} ms\n"
        f"  sim:  TTFT mean {1e3 * sim_ttft['mean']:.1f} ms, P90 {1e3 * sim_ttft['p90']:.1f} ms; hit rate {s['token_hit_rate']:.3f}\n"
        f"  sim / real: mean {out['sim_over_real']['mean']:.3f}, P90 {out['sim_over_real']['p90']:.3f}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
