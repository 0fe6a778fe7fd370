"""Router overhead: placement latency and throughput through gRPC with instant workers (issue 10).

    python bench/router_overhead.py [--seconds 20] [--concurrency 64] [--redis] [--tls] [--json OUT] [--profile]

The router runs in this process, on its event loop (one core for the Python
side); an engine that answers at once (``bench/instant_engine.py``: 8 ranks
as 4,2,2, real cache events) and the load clients run in two other
processes. Clients are closed loop (``--concurrency`` callers, each sending
its next request when the last is answered) with prompts that share heads
(prefix hits, a growing index), so the router does all its real work:
validation, block hashing, placement over the index, forwarding, the
followers' cache events, completions.

Reported: requests per second through the router; the router process's
CPU seconds per request; **placement** latency p50 / p99 / max (validation
+ admission + hashing + ``schedule``, exact samples); the clients' end-to-end
latency p50 / p99; and with ``--profile``, where the router's time goes (the
top of a cProfile of its process). ``--redis`` starts a ``redis-server``
and puts the index and the load board in it (``--redis-url`` uses one). ``--tls``
serves the public port over TLS (a certificate from a CA made for the run; the clients
verify it), as a CPPool with ``spec.router.tls`` does; the bare proxy stays plaintext.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


sys.path.insert(0, str(ROOT))
from sim_to_real import _free_base  # noqa: E402  (one port helper for the benches)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# -- the client process ----------------------------------------------------------------


async def _clients(
    target: str, seconds: float, concurrency: int, seed: int, ca: str = "", name: str = ""
) -> dict[str, object]:
    import random

    import grpc

    from vertumnus._proto import pool_pb2, pool_pb2_grpc
    from vertumnus.channels import channel

    rng = random.Random(seed)
    heads = [[rng.randrange(256) for _ in range(64)] for _ in range(16)]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    count = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    async with channel(target, ca, name, aio=True) as ch:
        stub = pool_pb2_grpc.PrefillStub(ch)

        async def caller(c: int) -> None:
            nonlocal count
            i = 0
            while loop.time() < stop_at:
                tokens = heads[rng.randrange(16)] + [
                    rng.randrange(256) for _ in range(rng.randint(8, 64))
                ]
                t0 = loop.time()
                try:
                    await stub.Prefill(
                        pool_pb2.PrefillRequest(request_id=f"c{c}-{i}", token_ids=tokens),
                        timeout=30,
                    )
                    latencies.append(loop.time() - t0)
                    count += 1
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                i += 1

        await asyncio.gather(*(caller(c) for c in range(concurrency)))
    return {"completed": count, "errors": errors, "latencies": latencies}


# -- the router process (this one) -----------------------------------------------------------


class _BareProxy:
    """The ceiling of the architecture: a gRPC aio server that forwards every Prefill
    to one fixed worker and answers with its reply — no validation, placement, index
    or accounting. What the router costs beyond it is the router's own work."""

    def __init__(self, engine: str) -> None:
        import grpc

        from vertumnus._proto import pool_pb2, pool_pb2_grpc, worker_pb2, worker_pb2_grpc

        self._channel = grpc.aio.insecure_channel(engine)
        stub = worker_pb2_grpc.WorkerStub(self._channel)

        class Servicer(pool_pb2_grpc.PrefillServicer):
            async def Prefill(self, request, context):  # type: ignore[no-untyped-def]
                reply = await stub.Prefill(
                    worker_pb2.PrefillRequest(
                        request_id=request.request_id, token_ids=request.token_ids
                    ),
                    timeout=30,
                )
                return pool_pb2.PrefillResponse(
                    request_id=request.request_id, first_token_id=reply.first_token_id
                )

        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pool_pb2_grpc.add_PrefillServicer_to_server(Servicer(), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    async def stop(self) -> None:
        await self.server.stop(1.0)
        await self._channel.close()


async def _measure(target: str, args: argparse.Namespace) -> tuple[dict[str, object], float, float]:
    """Clients against ``target`` for ``--seconds``: (their result, wall s, this process's CPU s)."""
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    result = await asyncio.to_thread(
        _client_run, target, args.seconds, args.concurrency, 2, args.others_cpus, args.client_tls
    )
    wall = time.perf_counter() - wall0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return result, wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


async def _bare(engine: str, args: argparse.Namespace) -> dict[str, object]:
    proxy = _BareProxy(engine)
    await proxy.server.start()
    try:
        await asyncio.to_thread(
            _client_run, proxy.address, 2.0, args.concurrency, 1, args.others_cpus
        )
        result, wall, cpu = await _measure(proxy.address, args)
    finally:
        await proxy.stop()
    completed = int(result["completed"])  # type: ignore[call-overload]
    return {
        "completed": completed,
        "throughput_rps": completed / wall,
        "cpu_us_per_request": 1e6 * cpu / max(completed, 1),
        "cores_busy": cpu / wall,
    }


def _pin(cpus: set[int] | None) -> list[str]:
    """A command prefix that runs a process on ``cpus`` (``taskset``), or nothing."""
    exe = shutil.which("taskset")
    return [exe, "-c", ",".join(map(str, sorted(cpus)))] if cpus and exe else []


async def _run(args: argparse.Namespace) -> dict[str, object]:
    from vertumnus.router.serve import start_router
    from vertumnus.router.settings import RouterSettings

    base = _free_base(8)
    engine = subprocess.Popen(
        [
            *_pin(args.others_cpus),
            sys.executable,
            str(ROOT / "instant_engine.py"),
            "--ranks",
            "8",
            "--degrees",
            "4,2,2",
            "--base-port",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    redis_proc = None
    tmp = tempfile.TemporaryDirectory()
    try:
        store = None
        url = args.redis_url
        if args.redis and url is None:
            exe = shutil.which("redis-server")
            if exe is None:
                raise SystemExit("--redis needs redis-server (apt-get install redis-server)")
            port = _free_base(1)
            redis_proc = subprocess.Popen(
                [
                    exe,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    tmp.name,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            url = f"redis://127.0.0.1:{port}/0"
            time.sleep(0.5)
        if url is not None:
            from vertumnus.router.mirror import redis_store_for

            store = redis_store_for(url, "bench", "cpu-tiny")
        tls = {}
        if args.tls:
            import datetime

            from vertumnus.admintls import issue, new_ca

            now = datetime.datetime.now(datetime.UTC)
            ca = new_ca("bench-ca", now, days=1)
            issued = issue(ca[0], ca[1], "bench-router", now)
            files = {"ca.crt": ca[0], "tls.crt": issued.cert_pem, "tls.key": issued.key_pem}
            for name, pem in files.items():
                (Path(tmp.name) / name).write_bytes(pem)
            tls = {"tls_cert_file": f"{tmp.name}/tls.crt", "tls_key_file": f"{tmp.name}/tls.key"}
            args.client_tls = (f"{tmp.name}/ca.crt", "bench-router")
        settings = RouterSettings(
            listen=f"127.0.0.1:{_free_base(1)}",
            metrics_listen="",
            profile="cpu-tiny",
            admission_limit=max(1024, 4 * args.concurrency),
            **tls,
        )
        running = await start_router(
            settings, [f"127.0.0.1:{base}"], store=store, discover_timeout_s=30
        )
        router = running.router
        # Warm up: a few seconds to fill the index and the connections.
        await asyncio.to_thread(
            _client_run, running.address, 2.0, args.concurrency, 1, args.others_cpus,
            args.client_tls,
        )  # fmt: skip
        router.metrics.placement_samples.clear()
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        result, wall, cpu = await _measure(running.address, args)
        if prof is not None:
            prof.disable()
        samples = list(router.metrics.placement_samples)
        index_blocks = len(router.store)
        await running.stop(1.0)
        args.client_tls = ("", "")  # the bare proxy: plaintext
        # The same clients through a bare forwarding proxy, against the same engine.
        bare = await _bare(f"127.0.0.1:{base}", args) if args.bare else None
    finally:
        engine.terminate()
        engine.wait(10)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        tmp.cleanup()
    lat = result["latencies"]
    assert isinstance(lat, list)
    completed = int(result["completed"])  # type: ignore[call-overload]
    out: dict[str, object] = {
        "store": "redis" if url is not None else "memory",
        "tls": args.tls,
        "concurrency": args.concurrency,
        "seconds": wall,
        "completed": completed,
        "errors": result["errors"],
        "throughput_rps": completed / wall,
        "router_cpu_s": cpu,
        "router_cpu_us_per_request": 1e6 * cpu / max(completed, 1),
        "router_cores_busy": cpu / wall,
        "placement_us": {
            "p50": 1e6 * _pct(samples, 0.50),
            "p99": 1e6 * _pct(samples, 0.99),
            "max": 1e6 * max(samples) if samples else float("nan"),
            "mean": 1e6 * statistics.fmean(samples) if samples else float("nan"),
            "samples": len(samples),
        },
        "client_latency_ms": {"p50": 1e3 * _pct(lat, 0.5), "p99": 1e3 * _pct(lat, 0.99)},
        "index_blocks": index_blocks,
    }
    if bare is not None:
        out["bare_proxy"] = bare
    if prof is not None:
        import io
        import pstats

        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        out["profile"] = buf.getvalue()
    return out


def _client_run(
    target: str,
    seconds: float,
    concurrency: int,
    seed: int,
    cpus: set[int] | None,
    tls: tuple[str, str] = ("", ""),
) -> dict[str, object]:
    """The clients, in a process of their own (they must not eat the router's core)."""
    proc = subprocess.run(
        [
            *_pin(cpus),
            sys.executable,
            __file__,
            "--client",
            target,
            "--seconds",
            str(seconds),
            "--concurrency",
            str(concurrency),
            "--seed",
            str(seed),
            "--client-tls",
            *tls,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--redis", action="store_true")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--bare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure a bare forwarding proxy (gRPC's own cost) in the same run",
    )
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the router on the first CPU and everything else on the rest (taskset)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tls", action="store_true", help="serve the public port over TLS")
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--client-tls", nargs=2, default=("", ""), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.others_cpus = None
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) >= 2 and not args.client:
        # The router (this process) alone on one core, the engine and the clients on
        # the others: "on one core" as measured, and no preemption in its latencies.
        os.sched_setaffinity(0, {cpus[0]})
        args.others_cpus = set(cpus[1:])
    if args.client:
        print(
            json.dumps(
                asyncio.run(
                    _clients(
                        args.client, args.seconds, args.concurrency, args.seed, *args.client_tls
                    )
                )
            )
        )
        return 0
    out = asyncio.run(_run(args))
    p = out["placement_us"]
    assert isinstance(p, dict)
    print(
        f"store {out['store']}{', TLS' if args.tls else ''}: {out['throughput_rps']:.0f} requests/s through the router "
        f"({out['completed']} in {out['seconds']:.1f} s, errors {out['errors']}); router CPU "
        f"{out['router_cpu_us_per_request']:.0f} µs/request ({out['router_cores_busy']:.2f} cores busy); "
        f"placement p50 {p['p50']:.0f} µs, p99 {p['p99']:.0f} µs, max {p['max']:.0f} µs; index {out['index_blocks']} blocks"
    )
    bare = out.get("bare_proxy")
    if isinstance(bare, dict):
        print(
            f"bare proxy: {bare['throughput_rps']:.0f} requests/s, {bare['cpu_us_per_request']:.0f} µs/request "
            f"({bare['cores_busy']:.2f} cores busy): the router costs "
            f"{out['router_cpu_us_per_request'] / bare['cpu_us_per_request']:.2f}x gRPC's own forwarding"
        )
    if "profile" in out:
        print(out["profile"])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
