"""Two router replicas on one Redis against one router, same load (issue 10).

    python bench/two_replicas.py [--trace PATH|synthetic] [--rate-scale 6]
        [--requests 1000] [--json OUT]

One engine process (``vertumnus serve``: 8 CPU ranks as CP4 + CP2 + CP2, the
``vertumnus up`` default) and a ``redis-server``; then, each on fresh engines
and a flushed Redis, the same scaled trace through ``vertumnus load``:

- **one router** (``vertumnus router``, index from the workers, written to Redis);
- **two routers, load shared**: a second replica following the index through
  Redis (``--index-source store``), both exchanging their outstanding work per
  worker through Redis; the load alternates between them, as a round-robin
  balancer in front of two replicas would send it;
- **two routers, not shared** (``--no-share-load``): each sees only its own
  requests' outstanding work.

Reported: mean / P90 TTFT, hit rate and completions of each, and the ratios to
one router. What it shows is what sharing outstanding work buys: without it,
two replicas each think a worker is idle when the other has just filled it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
sys.path.insert(0, str(ROOT / "bench"))

from sim_to_real import _cli, _free_base  # noqa: E402


def _wait_health(
    address: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{proc.args[3:5]} exited ({proc.returncode}); see {log}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.3)
    raise SystemExit(f"{address} not serving after {timeout} s; see {log}")


def _run(config: str, args: argparse.Namespace, redis_url: str, tmp: Path) -> dict[str, object]:
    import redis

    redis.Redis.from_url(redis_url).flushall()
    engine_port = _free_base(8)
    logs = tmp / config
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engine = subprocess.Popen(
            _cli(
                "serve",
                "--ranks",
                "8",
                "--degrees",
                "4,2,2",
                "--worker-ids",
                "0,4,6",
                "--base-port",
                str(engine_port),
                "--num-blocks",
                "1024",
            ),
            stderr=(logs / "engine.log").open("wb"),
        )
        procs.append(engine)
        _wait_health(f"127.0.0.1:{engine_port}", engine, logs / "engine.log")
        replicas = 1 if config == "one router" else 2
        targets = []
        for i in range(replicas):
            port = _free_base(1)
            cmd = _cli(
                "router",
                "--engine",
                f"127.0.0.1:{engine_port}",
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-listen",
                "",
                "--redis-url",
                redis_url,
                "--router-id",
                f"replica-{i}",
            )
            if i > 0:  # one cache manager per pool; the second follows the index in Redis
                cmd += ["--index-source", "store", "--no-cache-manager"]
            if config == "two routers, not shared":
                cmd.append("--no-share-load")
            log = logs / f"router-{i}.log"
            proc = subprocess.Popen(cmd, stderr=log.open("wb"))
            procs.append(proc)
            _wait_health(f"127.0.0.1:{port}", proc, log)
            targets.append(f"127.0.0.1:{port}")
        out = logs / "load.json"
        subprocess.run(
            _cli(
                "load",
                "--target",
                ",".join(targets),
                "--trace",
                args.trace,
                "--rate-scale",
                str(args.rate_scale),
                "--requests",
                str(args.requests),
                "--no-progress",
                "--json",
                str(out),
            ),
            check=False,
        )
        return json.loads(out.read_text())["summary"]
    finally:
        for p in reversed(procs):
            p.send_signal(2)
        for p in reversed(procs):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trace", default=str(MOONCAKE) if MOONCAKE.exists() else "synthetic")
    ap.add_argument("--rate-scale", type=float, default=6.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("needs redis-server (Debian: apt-get install redis-server)")
    tmp = Path(tempfile.mkdtemp(prefix="two-replicas-"))
    port = _free_base(1)
    redis_proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        cwd=tmp,
    )
    redis_url = f"redis://127.0.0.1:{port}/0"
    time.sleep(0.5)
    results: dict[str, dict[str, object]] = {}
    try:
        for config in ("one router", "two routers, shared", "two routers, not shared"):
            results[config] = _run(config, args, redis_url, tmp)
            r = results[config]
            print(
                f"{config}: {r['completed']}/{r['sent']} completed, {r['failed']} failed; TTFT mean "
                f"{1e3 * float(r['mean_ttft_s']):.1f} ms, P90 {1e3 * float(r['p90_ttft_s']):.1f} ms; "  # type: ignore[arg-type]
                f"hit rate {float(r['token_hit_rate']):.3f}",  # type: ignore[arg-type]
                flush=True,
            )
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
    base = results["one router"]
    ratios = {
        c: {
            k: float(r[k]) / float(base[k])  # type: ignore[arg-type]
            for k in ("mean_ttft_s", "p90_ttft_s")
        }
        for c, r in results.items()
    }
    for c, q in ratios.items():
        print(f"  {c} / one router: mean {q['mean_ttft_s']:.3f}, P90 {q['p90_ttft_s']:.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "trace": args.trace,
                    "rate_scale": args.rate_scale,
                    "requests": args.requests,
                    "results": results,
                    "ratios_to_one_router": ratios,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
