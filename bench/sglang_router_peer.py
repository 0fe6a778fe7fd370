"""The real SGLang router (and vllm-router) as a peer on the same local pool (issue 13, part 5).

    python bench/sglang_router_peer.py [--composition 2xCP1 --ranks 2] [--trace PATH|synthetic]
        [--rate-scale 12] [--requests 1500] [--length-scale 0.03125] [--max-tokens 4096]
        [--systems vertumnus,sglang,sglang+fifo2,vllm] [--send input_ids|text] [--json OUT]

Peers, as installed from PyPI for this run (``pip install sglang-router==0.3.2
vllm-router==0.1.17``, or the ``peers`` extra); neither is a dependency of the project:

- ``sglang-router`` **0.3.2** (sgl-model-gateway 0.3.2, the Rust router of SGLang),
  ``--policy cache_aware``, every other setting its default;
- ``vllm-router`` **0.1.17** (vLLM's fork of it), ``--policy cache_aware``.

Each system gets fresh CPU engines of the tiny model, built the way ``vertumnus up``
builds them (:class:`vertumnus.local.LocalPool`, ``--composition C --ranks R``, 1,024
blocks of 16 tokens per rank), so every run starts with empty caches:

- **vertumnus**: ``vertumnus up --composition C --ranks R --no-controller`` (our router:
  cost-model placement over cached and in-flight prefixes, the cache manager on), driven
  by ``vertumnus load`` — the project's gRPC client;
- **sglang-router / vllm-router**: the same engines without our router
  (``LocalPool.start_engines``), one ``vertumnus http-surface`` per worker (the SGLang
  HTTP API over the worker's gRPC endpoint), the peer router over those surfaces, and an
  open-loop HTTP client in this script that sends the same requests (``loadgen``'s trace
  scaling and :func:`~vertumnus.loadgen.request_tokens`) at the same times (the same
  schedule as :func:`~vertumnus.loadgen.run_load`) to the router's ``/generate``, as
  ``input_ids`` (``--send text``: one character per token, see
  :mod:`vertumnus.worker.http_surface`). Bodies are serialised before the run starts;
- **PEER+fifo2** (e.g. ``sglang+fifo2``): the same, with surfaces that hold all but two
  requests per worker in arrival order (``http-surface --max-outstanding 2``), our router's
  queueing discipline (one running, one forwarded ahead). Without it every request reaches
  the engine at once and its dispatcher batches what is queued into one step (as an SGLang
  server batches prefills), so the difference between ``sglang`` and ``sglang+fifo2`` is
  queueing, and between ``sglang+fifo2`` and ``vertumnus`` placement.

Before the load, each path's fixed per-request cost is measured on the idle pool: the
median client TTFT of one-at-a-time 15-token requests (shorter than a block: they leave
nothing in the cache). The peer path has one hop more than ours (router → surface →
worker's gRPC), and this says how much it costs.

Reported per system: requests completed / failed, client TTFT (for a prefill-only engine,
the time to the response) mean / P50 / P90 / P99, token hit rate (cached tokens / prompt
tokens, from the workers' answers), each worker's share of the requests and its mean
queueing, and, for the peers, every HTTP call the router made on the surfaces (path and
count): the endpoints it really needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
sys.path.insert(0, str(ROOT / "bench"))

from sim_to_real import _cli, _free_base, _start_pool  # noqa: E402

PEERS = {
    # name: (distribution, launcher module, the router's list-of-workers path)
    "sglang": ("sglang-router", "sglang_router.launch_router", "/workers"),
    "vllm": ("vllm-router", "vllm_router.launch_router", "/list_workers"),
}
PROBE_TOKENS = 15  # shorter than the engines' 16-token block: a probe caches nothing
PROBES = 20


# -- requests -------------------------------------------------------------------------


def _requests(args: argparse.Namespace) -> tuple[list[Any], list[list[int]]]:
    """The requests and their tokens exactly as ``vertumnus load`` makes them (cmd_load)."""
    from vertumnus.loadgen import request_tokens
    from vertumnus.sim.traces import load_trace, scale_lengths, scale_rate

    trace = load_trace(args.trace, seed=args.seed)
    if args.rate_scale != 1:
        trace = scale_rate(trace, args.rate_scale)
    trace = scale_lengths(trace, args.length_scale, args.max_tokens)
    requests = list(trace.requests[: args.requests] if args.requests else trace.requests)
    memo: dict[int, list[int]] = {}
    tokens = [
        request_tokens(r, trace.block_size, 1.0, args.vocab, args.max_tokens, memo)
        for r in requests
    ]
    return requests, tokens


def _probe_tokens() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, size=PROBE_TOKENS).tolist() for _ in range(PROBES)]


def _body(rid: str, toks: list[int], send: str) -> bytes:
    body: dict[str, Any] = {"rid": rid, "sampling_params": {"max_new_tokens": 1}}
    if send == "text":
        body["text"] = "".join(map(chr, toks))
    else:
        body["input_ids"] = toks
    return json.dumps(body).encode()


# -- statistics -----------------------------------------------------------------------


def _summary(records: list[dict[str, Any]], sent: int, wall_s: float) -> dict[str, Any]:
    ok = [r for r in records if "ttft_s" in r]
    t = np.array([r["ttft_s"] for r in ok]) if ok else np.array([np.nan])
    prompt = sum(r["tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    errors = Counter(r["error"] for r in records if "error" in r)
    per_worker: dict[str, dict[str, float]] = {}
    for w in sorted({str(r.get("worker")) for r in ok}):
        mine = [r for r in ok if str(r.get("worker")) == w]
        per_worker[w] = {
            "share": len(mine) / len(ok),
            "token_share": sum(r["tokens"] for r in mine) / max(1, prompt),
            "hit_rate": sum(r["cached_tokens"] for r in mine)
            / max(1, sum(r["tokens"] for r in mine)),
            "mean_queue_s": statistics.fmean(r["queue_s"] for r in mine),
        }
    return {
        "sent": sent,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": dict(sorted(errors.items())),
        "mean_ttft_s": float(t.mean()),
        "p50_ttft_s": float(np.percentile(t, 50)),
        "p90_ttft_s": float(np.percentile(t, 90)),
        "p99_ttft_s": float(np.percentile(t, 99)),
        "token_hit_rate": cached / prompt if prompt else float("nan"),
        "mean_execution_s": statistics.fmean(r["execution_s"] for r in ok) if ok else None,
        "mean_queue_s": statistics.fmean(r["queue_s"] for r in ok) if ok else None,
        # What the client waited beyond the queue and the engine step: every hop, the
        # router's own work, and CPU time the processes of the path took from the ranks.
        "mean_path_s": statistics.fmean(r["ttft_s"] - r["queue_s"] - r["execution_s"] for r in ok)
        if ok
        else None,
        # ... of which outside the last stage before the engine (our router; the surface).
        "mean_before_last_hop_s": statistics.fmean(r["ttft_s"] - r["served_s"] for r in ok)
        if ok
        else None,
        "wall_s": wall_s,
        "workers": per_worker,
    }


# -- our side -------------------------------------------------------------------------


async def _idle_grpc(target: str) -> float:
    import grpc

    from vertumnus._proto import pool_pb2, pool_pb2_grpc

    out = []
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pool_pb2_grpc.PrefillStub(ch)
        for i, toks in enumerate(_probe_tokens()):
            t0 = time.perf_counter()
            await stub.Prefill(
                pool_pb2.PrefillRequest(request_id=f"probe-{i}", token_ids=toks), timeout=30
            )
            out.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)
    return statistics.median(out[5:])


def run_vertumnus(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    logs = tmp / "vertumnus"
    logs.mkdir()
    proc, target = _start_pool(args, logs / "up.log")
    try:
        idle = asyncio.run(_idle_grpc(target))
        out = logs / "load.json"
        t0 = time.perf_counter()
        subprocess.run(
            _cli(
                "load",
                "--target",
                target,
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
                "--vocab",
                str(args.vocab),
                "--records",
                "--no-progress",
                "--json",
                str(out),
            ),
            check=False,
        )
        wall = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    doc = json.loads(out.read_text())
    records = []
    for r in doc["records"]:
        if "error" in r:
            records.append({"id": r["id"], "error": r["error"]})
        else:
            records.append(
                {
                    "id": r["id"],
                    "tokens": r["tokens"],
                    "ttft_s": r["ttft_s"],
                    "cached_tokens": r["cached_tokens"],
                    "worker": r["worker"],
                    "queue_s": r["queue_s"],
                    "execution_s": r["execution_s"],
                    # receipt at the router to its answer (router queue, gRPC hop, engine)
                    "served_s": r["router_ttft_s"],
                }
            )
    summary = _summary(records, doc["summary"]["sent"], doc["summary"]["wall_s"])
    summary["idle_overhead_s"] = idle
    summary["client_wall_s"] = wall
    summary["router"] = "vertumnus (vertumnus up --no-controller; cost model, cache manager)"
    return summary


# -- the peers' side ------------------------------------------------------------------


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def _start_engines(args: argparse.Namespace, logs: Path) -> tuple[Any, list[tuple[int, str]]]:
    """The engines ``vertumnus up`` would start (no router); each worker's (id, endpoint)."""
    import grpc

    from vertumnus._proto import worker_pb2, worker_pb2_grpc
    from vertumnus.core.types import Composition
    from vertumnus.local import LocalPool, PoolSpec, engine_degrees

    composition = Composition.parse(args.composition)
    spec = PoolSpec(
        composition=composition,
        ranks=args.ranks,
        engine_port=_free_base(composition.gpus * 2),
        controller=False,
    )
    pool = LocalPool(spec)
    pool.logs = logs  # keep the engine logs with the bench's
    pool.start_engines()
    workers = []
    for d, degrees in enumerate(engine_degrees(composition, args.ranks)):
        offset = 0
        for degree in degrees:
            port = spec.engine_port + d * args.ranks + offset
            workers.append((d * args.ranks + offset, f"{spec.host}:{port}"))
            offset += degree
    deadline = time.monotonic() + 300
    for _, address in workers:
        with grpc.insecure_channel(address) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            while True:
                if any(p.poll() is not None for p in pool.engines):
                    pool.stop_processes()
                    raise RuntimeError(f"an engine exited; see {logs}")
                try:
                    stub.Describe(worker_pb2.DescribeRequest(), timeout=1.0)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        pool.stop_processes()
                        raise RuntimeError(f"engines did not answer in 300 s; see {logs}") from None
                    time.sleep(0.3)
    return pool, workers


def _start_surface(
    worker: str, log: Path, max_outstanding: int
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_base(1)
    proc = subprocess.Popen(
        _cli(
            "http-surface",
            "--worker",
            worker,
            "--listen",
            f"127.0.0.1:{port}",
            "--max-outstanding",
            str(max_outstanding),
        ),
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("vertumnus http-surface:"):
        proc.kill()
        raise RuntimeError(f"http-surface for {worker} did not start: {line!r}; see {log}")
    return proc, f"http://127.0.0.1:{port}"


def _start_router(peer: str, urls: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    _, module, workers_path = PEERS[peer]
    port, prom = _free_base(1), _free_base(1)
    cmd = [
        sys.executable,
        "-m",
        module,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        "--policy",
        "cache_aware",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prom),
        "--log-level",
        "warn" if peer == "sglang" else "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{peer} router exited ({proc.returncode}): {log.read_text()[-2000:]}"
            )
        ready, _ = _get(base + "/readiness")
        code, text = _get(base + workers_path)
        listed = code != 200 or all(u.removeprefix("http://") in text for u in urls)
        if ready == 200 and listed:
            return proc, base
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{peer} router not ready in 120 s: {log.read_text()[-2000:]}")


async def _replay_http(
    base: str,
    requests: Sequence[Any],
    tokens: Sequence[list[int]],
    send: str,
    timeout_s: float,
) -> tuple[list[dict[str, Any]], float, float]:
    """The idle probe, then the same open-loop schedule as ``run_load`` over HTTP."""
    import aiohttp

    url = base + "/generate"
    headers = {"Content-Type": "application/json"}
    bodies = [_body(f"load-{r.id}", t, send) for r, t in zip(requests, tokens, strict=True)]
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    records: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        idle = []
        for i, toks in enumerate(_probe_tokens()):
            t0 = time.perf_counter()
            async with s.post(url, data=_body(f"probe-{i}", toks, send), headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"probe {i}: HTTP {r.status}: {await r.text()}")
            idle.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.05
        first = requests[0].arrival_s if requests else 0.0

        async def one(r: Any, toks: list[int], body: bytes) -> None:
            delay = t0 + (r.arrival_s - first) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = loop.time()
            try:
                async with s.post(url, data=body, headers=headers) as resp:
                    data = await resp.read()
                    status = resp.status
            except (TimeoutError, aiohttp.ClientError) as e:
                records.append({"id": r.id, "error": type(e).__name__})
                return
            ttft = loop.time() - sent
            if status != 200:
                records.append(
                    {"id": r.id, "error": f"HTTP {status}", "detail": data[:300].decode()}
                )
                return
            meta = json.loads(data)["meta_info"]
            records.append(
                {
                    "id": r.id,
                    "tokens": len(toks),
                    "ttft_s": ttft,
                    "cached_tokens": meta["cached_tokens"],
                    "worker": meta.get("worker"),
                    "queue_s": meta.get("queue_seconds", 0.0),
                    "surface_queue_s": meta.get("surface_queue_seconds", 0.0),
                    "execution_s": meta.get("execution_seconds", 0.0),
                    # receipt at the surface to its answer (gate, gRPC hop, engine)
                    "served_s": meta.get("e2e_latency", 0.0),
                }
            )

        started = time.perf_counter()
        await asyncio.gather(
            *(one(r, t, b) for r, t, b in zip(requests, tokens, bodies, strict=True))
        )
        wall = time.perf_counter() - started
    return records, wall, statistics.median(idle[5:])


def run_peer(
    system: str,
    args: argparse.Namespace,
    tmp: Path,
    requests: Sequence[Any],
    tokens: Sequence[list[int]],
) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    peer, _, variant = system.partition("+")
    max_outstanding = int(variant.removeprefix("fifo")) if variant else 0
    dist = PEERS[peer][0]
    try:
        ver = version(dist)
    except PackageNotFoundError:
        return {"router": dist, "error": f"{dist} is not installed (pip install {dist})"}
    logs = tmp / system
    logs.mkdir()
    pool, workers = _start_engines(args, logs)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for wid, address in workers:
            proc, url = _start_surface(address, logs / f"surface-{wid}.log", max_outstanding)
            procs.append(proc)
            urls.append(url)
        router, base = _start_router(peer, urls, logs / "router.log")
        procs.append(router)
        records, wall, idle = asyncio.run(
            _replay_http(base, requests, tokens, args.send, args.timeout)
        )
        calls: Counter[str] = Counter()
        for url in urls:
            code, text = _get(url + "/vertumnus/stats")
            if code == 200:
                calls.update(json.loads(text)["calls"])
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        pool.stop_processes()
    summary = _summary(records, len(requests), wall)
    summary["idle_overhead_s"] = idle
    summary["router"] = f"{dist} {ver} --policy cache_aware"
    summary["surface_max_outstanding"] = max_outstanding
    if max_outstanding:
        summary["mean_surface_queue_s"] = statistics.fmean(
            r["surface_queue_s"] for r in records if "ttft_s" in r
        )
    summary["endpoints_called"] = dict(sorted(calls.items()))
    summary["first_errors"] = [r for r in records if "error" in r][:5]
    return summary


# -- main -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--composition", default="2xCP1")
    ap.add_argument("--ranks", type=int, default=2, help="CPU ranks per engine")
    ap.add_argument("--trace", default=str(MOONCAKE) if MOONCAKE.exists() else "synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate-scale", type=float, default=12.0)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--length-scale", type=float, default=1 / 32)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=120.0, help="each request's deadline (s)")
    ap.add_argument("--profile", default="cpu-tiny", help="our router's prefill-time profile")
    ap.add_argument(
        "--systems",
        default="vertumnus,sglang,sglang+fifo2,vllm",
        help="comma-separated: vertumnus, sglang, vllm; PEER+fifoN runs PEER over surfaces that "
        "hold all but N requests per worker (http-surface --max-outstanding N; fifo2 is our "
        "router's one running + one ahead). Default vertumnus,sglang,sglang+fifo2,vllm",
    )
    ap.add_argument("--send", choices=("input_ids", "text"), default="input_ids")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [
        s
        for s in systems
        if s != "vertumnus"
        and not (
            s.partition("+")[0] in PEERS
            and (not s.partition("+")[2] or s.partition("+")[2].removeprefix("fifo").isdigit())
        )
    ]
    if unknown:
        ap.error(f"--systems: unknown {unknown}; use vertumnus, {', '.join(PEERS)}, or PEER+fifoN")

    requests, tokens = _requests(args)
    tmp = Path(tempfile.mkdtemp(prefix="sglang-router-peer-"))
    print(f"logs in {tmp}", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    for system in systems:
        try:
            if system == "vertumnus":
                results[system] = run_vertumnus(args, tmp)
            else:
                results[system] = run_peer(system, args, tmp, requests, tokens)
        except Exception as e:  # a peer that does not work is a result, not a crash
            results[system] = {"error": f"{type(e).__name__}: {e}"}
        r = results[system]
        if "error" in r:
            print(f"{system}: FAILED: {r['error']}", flush=True)
        else:
            print(
                f"{system}: {r['completed']}/{r['sent']} completed, {r['failed']} failed; TTFT mean "
                f"{1e3 * r['mean_ttft_s']:.1f} ms, P50 {1e3 * r['p50_ttft_s']:.1f}, P90 "
                f"{1e3 * r['p90_ttft_s']:.1f}, P99 {1e3 * r['p99_ttft_s']:.1f} ms; hit rate "
                f"{r['token_hit_rate']:.3f}; idle overhead {1e3 * r['idle_overhead_s']:.2f} ms",
                flush=True,
            )
        time.sleep(2)
    base = results.get("vertumnus", {})
    ratios = {}
    if "mean_ttft_s" in base:
        for name, r in results.items():
            if name != "vertumnus" and "mean_ttft_s" in r:
                ratios[f"{name} / vertumnus"] = {
                    k: r[f"{k}_ttft_s"] / base[f"{k}_ttft_s"] for k in ("mean", "p50", "p90", "p99")
                }
                q = ratios[f"{name} / vertumnus"]
                print(f"  {name} / vertumnus: mean {q['mean']:.3f}, P90 {q['p90']:.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "cpus": len(os.sched_getaffinity(0)),
                    "composition": args.composition,
                    "ranks": args.ranks,
                    "trace": args.trace,
                    "rate_scale": args.rate_scale,
                    "requests": args.requests,
                    "length_scale": args.length_scale,
                    "max_tokens": args.max_tokens,
                    "send": args.send,
                    "results": results,
                    "ratios": ratios,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
