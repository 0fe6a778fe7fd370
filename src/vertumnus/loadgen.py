"""``vertumnus load``: drive any Vertumnus pool with a trace, through real gRPC clients.

A trace (Mooncake JSONL, Azure CSV, or the built-in synthetic generator)
gives arrival times, prompt lengths and prefix structure (chained block
keys). Real engines need token ids, so each request is turned into tokens
that keep the trace's prefix structure at the engine's scale:

- lengths are scaled by ``length_scale`` (a trace block of 512 tokens
  becomes ``512 × length_scale`` tokens: with the torch engine's 16-token
  blocks, 1/32);
- the tokens of block j are drawn from a generator seeded with the
  request's chained key of block j, so two requests share the tokens of
  their first j blocks exactly when the trace says they share that prefix
  (and the engine's own block hashing finds the same sharing).

Requests are sent open loop at the trace's (scaled) arrival times, each
with its own deadline; the report counts completed, failed and rejected
(``RESOURCE_EXHAUSTED``) requests and gives TTFT statistics as the client
measured them and as the router reported them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.channels import add_tls_flags, channel
from vertumnus.core.types import Request

__all__ = ["LoadReport", "request_tokens", "run_load"]


def request_tokens(
    request: Request,
    trace_block: int,
    length_scale: float,
    vocab_size: int,
    max_tokens: int,
    memo: dict[int, list[int]] | None = None,
) -> list[int]:
    """Token ids for ``request`` at the engine's scale (see the module docstring).

    ``memo`` (block key → its tokens) saves drawing a shared prefix's tokens again
    for every request that reuses it."""
    block = max(1, round(trace_block * length_scale))
    length = max(1, min(max_tokens, round(request.length * length_scale)))
    memo = {} if memo is None else memo
    out: list[int] = []
    j = 0
    while len(out) < length:
        # A block beyond the trace's keys (a partial tail) is the request's own.
        key = request.block_keys[j] if j < len(request.block_keys) else ((request.id + 1) << 24) + j
        toks = memo.get(key)
        if toks is None:
            rng = np.random.default_rng(key & 0xFFFFFFFFFFFFFFFF)
            toks = memo[key] = rng.integers(0, vocab_size, size=block).tolist()
        out.extend(toks)
        j += 1
    return out[:length]


@dataclass
class LoadReport:
    target: str
    sent: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    router_ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    wall_s: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        t = np.array(self.ttft_s) if self.ttft_s else np.array([math.nan])
        r = np.array(self.router_ttft_s) if self.router_ttft_s else np.array([math.nan])
        return {
            "target": self.target,
            "sent": self.sent,
            "completed": self.completed,
            "failed": self.failed,
            "rejected": self.rejected,
            "errors": dict(sorted(self.errors.items())),
            "mean_ttft_s": float(t.mean()),
            "p50_ttft_s": float(np.percentile(t, 50)),
            "p90_ttft_s": float(np.percentile(t, 90)),
            "p99_ttft_s": float(np.percentile(t, 99)),
            "router_mean_ttft_s": float(r.mean()),
            "router_p90_ttft_s": float(np.percentile(r, 90)),
            "token_hit_rate": self.cached_tokens / self.prompt_tokens
            if self.prompt_tokens
            else math.nan,
            "wall_s": self.wall_s,
            "throughput_rps": self.completed / self.wall_s if self.wall_s > 0 else 0.0,
        }


async def run_load(
    target: str,
    requests: Sequence[Request],
    *,
    trace_block: int,
    length_scale: float,
    vocab_size: int = 256,
    max_tokens: int = 8192,
    timeout_s: float = 120.0,
    keep_records: bool = False,
    progress: Any = None,
    id_prefix: str = "load",
    tls_ca_file: str = "",
    tls_server_name: str = "",
) -> LoadReport:
    """Send ``requests`` to the pool at ``target`` (``host:port``, or several comma-separated:
    the pool's router replicas, taken in turn) at their arrival times; wait for all."""
    import grpc

    from vertumnus._proto import pool_pb2, pool_pb2_grpc

    report = LoadReport(target)
    memo: dict[int, list[int]] = {}
    tokens = [
        request_tokens(r, trace_block, length_scale, vocab_size, max_tokens, memo) for r in requests
    ]
    # Several routers (replicas of one pool): request i goes to the (i mod n)-th, as a
    # round-robin load balancer in front of them would send it.
    channels = [channel(t, tls_ca_file, tls_server_name, aio=True) for t in target.split(",")]
    stubs = [pool_pb2_grpc.PrefillStub(c) for c in channels]
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05
    first = requests[0].arrival_s if requests else 0.0

    async def one(r: Request, toks: list[int]) -> None:
        delay = t0 + (r.arrival_s - first) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = loop.time()
        report.sent += 1
        try:
            reply = await stubs[r.id % len(stubs)].Prefill(
                pool_pb2.PrefillRequest(request_id=f"{id_prefix}-{r.id}", token_ids=toks),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            name = e.code().name
            report.errors[name] = report.errors.get(name, 0) + 1
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                report.rejected += 1
            else:
                report.failed += 1
            if keep_records:
                report.records.append({"id": r.id, "error": name, "detail": e.details()})
        else:
            ttft = loop.time() - sent
            report.completed += 1
            report.ttft_s.append(ttft)
            report.router_ttft_s.append(reply.ttft_seconds)
            report.prompt_tokens += len(toks)
            report.cached_tokens += reply.cached_tokens
            if keep_records:
                report.records.append(
                    {
                        "id": r.id,
                        "arrival_s": r.arrival_s - first,
                        "tokens": len(toks),
                        "ttft_s": ttft,
                        "router_ttft_s": reply.ttft_seconds,
                        "worker": reply.worker,
                        "degree": reply.degree,
                        "cached_tokens": reply.cached_tokens,
                        "queue_s": reply.queue_seconds,
                        "execution_s": reply.execution_seconds,
                        "attempts": reply.attempts,
                        "epoch": reply.epoch,
                        "predicted_s": reply.predicted_seconds,
                    }
                )
        if progress is not None:
            progress.update(1)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(r, t) for r, t in zip(requests, tokens, strict=True)))
    finally:
        for c in channels:
            await c.close()
    report.wall_s = time.perf_counter() - started
    return report


def write_report(report: LoadReport, path: str | Path) -> None:
    doc = {"summary": report.summary(), "records": report.records}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


# -- the command ----------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "load",
        help="drive a running pool with a trace through real gRPC clients",
        description=(
            "Replay a trace (Mooncake JSONL, Azure CSV, or the synthetic generator) against a pool's "
            "router at its arrival times, and report completed, failed and rejected requests and TTFT."
        ),
    )
    p.add_argument(
        "--target",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the router's address; several (replicas of one pool) take requests in turn",
    )
    p.add_argument(
        "--trace",
        default="synthetic",
        help="synthetic[:KEY=VAL,...] | PATH.jsonl | PATH.csv (default synthetic)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the synthetic generator (default 0)"
    )
    p.add_argument(
        "--rate-scale", type=float, default=1.0, help="compress arrivals by X (default 1)"
    )
    p.add_argument("--requests", type=int, default=None, help="send only the first N requests")
    p.add_argument(
        "--length-scale",
        type=float,
        default=1 / 32,
        help="prompt lengths times this (default 1/32: a 512-token trace block becomes a 16-token engine block)",
    )
    p.add_argument(
        "--vocab",
        type=int,
        default=256,
        help="the engines' vocabulary size (default 256, the tiny model)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=8192, help="longest prompt sent (default 8192)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="each request's deadline in seconds (default 120)",
    )
    add_tls_flags(
        p, "a router whose public port serves TLS: --tls-cert-file, a CPPool's spec.router.tls"
    )
    p.add_argument("--json", dest="json_out", required=True, help="write the report here")
    p.add_argument(
        "--records", action="store_true", help="include one record per request in the JSON"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    p.set_defaults(func=cmd_load)


def cmd_load(args: Any) -> int:
    import sys

    from vertumnus.sim.traces import load_trace, scale_lengths, scale_rate

    if not args.rate_scale > 0 or not args.length_scale > 0 or not args.max_tokens > 0:
        print(
            "vertumnus: error: --rate-scale, --length-scale and --max-tokens must be > 0",
            file=sys.stderr,
        )
        return 2
    for t in args.target.split(","):
        host, sep, port = t.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            print(f"vertumnus: error: --target: expected HOST:PORT, got {t!r}", file=sys.stderr)
            return 2
    trace = load_trace(args.trace, seed=args.seed)
    if args.rate_scale != 1:
        trace = scale_rate(trace, args.rate_scale)
    # The same scaled requests as `vertumnus simulate --length-scale X --max-tokens M`.
    trace = scale_lengths(trace, args.length_scale, args.max_tokens)
    requests = list(trace.requests[: args.requests] if args.requests else trace.requests)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), unit="req", desc=f"load {args.target}")
    try:
        report = asyncio.run(
            run_load(
                args.target,
                requests,
                trace_block=trace.block_size,
                length_scale=1.0,
                vocab_size=args.vocab,
                max_tokens=args.max_tokens,
                timeout_s=args.timeout,
                keep_records=args.records,
                progress=bar,
                tls_ca_file=args.tls_ca_file,
                tls_server_name=args.tls_server_name,
            )
        )
    except ValueError as e:  # the CA file
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
    write_report(report, args.json_out)
    s = report.summary()
    print(
        f"{s['completed']}/{s['sent']} completed, {s['failed']} failed, {s['rejected']} rejected in "
        f"{s['wall_s']:.1f} s ({s['throughput_rps']:.1f} req/s); TTFT mean {s['mean_ttft_s']:.3f} s, "
        f"P90 {s['p90_ttft_s']:.3f} s; token hit rate {s['token_hit_rate']:.3f}; wrote {args.json_out}"
    )
    return 0 if s["failed"] == 0 else 1
