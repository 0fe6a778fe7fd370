"""How fast a failed SGLang worker is seen and replaced: the adapter's and the router's part.

A pod of two CP1 workers — ``vertumnus worker --engine sglang`` (the domain pod's own
command) over stand-in SGLang servers (``tests/worker/sglang_standin.py``: SGLang's
HTTP and KV-event surface, no GPU) — behind a real router on loopback. Each round
makes worker 1's server exit with no request in flight and times, on the wall clock:

- ``detect_s``: the exit → the router's ``GetPool`` reports the worker FAILED (its
  event stream ends, the router asks ``Describe``; what the operator polls, every 2 s);
- ``replace_s``: ``Admin.Drain`` + ``Admin.Switch`` of kind ``replace`` (the new
  worker's server started and healthy, the router's commit) — what the operator sends;
- ``first_answer_s``: then the first prefill answered by the new worker.

This is the overhead of our parts only: a real SGLang server loads weights and captures
CUDA graphs for tens of seconds to minutes, which only a GPU run measures
(``bench/gpu/sglang_check.py``); the stand-in starts in a fraction of a second. The
operator's 2 s poll comes on top of ``detect_s``.

::

    python bench/sglang_repair.py [--rounds 5] [--out bench-out/sglang_repair.json]
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
import urllib.request
from pathlib import Path

import grpc

from vertumnus._proto import pool_pb2, pool_pb2_grpc, worker_pb2, worker_pb2_grpc
from vertumnus.ports import free_port_base

STANDIN = Path(__file__).resolve().parents[1] / "tests" / "worker" / "sglang_standin.py"


def start_adapter(model: Path, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """The adapter over two stand-in CP1 servers; (process, gRPC base, HTTP base)."""
    base = free_port_base(12)
    argv = [
        sys.executable, "-m", "vertumnus", "worker", "--engine", "sglang",
        "--degrees", "1,1", "--worker-ids", "0,1", "--model", str(model),
        "--block-size", "16", "--max-tokens", "2048",
        "--launcher", f"{sys.executable} {STANDIN}",
        "--grpc-base-port", str(base), "--http-base-port", str(base + 2),
        "--bootstrap-base-port", str(base + 4), "--events-base-port", str(base + 6),
        "--replay-base-port", str(base + 8), "--nccl-base-port", str(base + 10),
        "--health-timeout", "30",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(f"127.0.0.1:{base}") as ch:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the adapter exited ({proc.returncode}); see {log}")
            try:
                worker_pb2_grpc.WorkerStub(ch).Describe(worker_pb2.DescribeRequest(), timeout=1)
                return proc, base, base + 2
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the adapter did not serve in 60 s; see {log}") from None
                time.sleep(0.2)


def crash(http_port: int) -> None:
    body = json.dumps({"crash": 7}).encode()
    with contextlib.suppress(OSError):  # it may die before it answers
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{http_port}/standin/control", data=body),
            timeout=5,
        ).read()


async def rounds(engine: str, http_base: int, n: int) -> list[dict[str, float]]:
    from vertumnus.router.serve import start_router
    from vertumnus.router.settings import RouterSettings

    settings = RouterSettings(
        listen=f"127.0.0.1:{free_port_base(1)}", metrics_listen="", cache_manager=None
    )
    running = await start_router(settings, [engine])
    out = []
    try:
        async with grpc.aio.insecure_channel(running.address) as ch:
            admin, prefill = pool_pb2_grpc.AdminStub(ch), pool_pb2_grpc.PrefillStub(ch)
            failing, epoch = 1, 1
            for r in range(n):
                t0 = time.perf_counter()
                crash(http_base + 1)
                while True:
                    pool = await admin.GetPool(pool_pb2.GetPoolRequest(), timeout=5)
                    state = {w.worker: w.state for w in pool.workers}
                    if state.get(failing) == pool_pb2.WorkerStatus.FAILED:
                        break
                    if time.perf_counter() - t0 > 30:
                        raise SystemExit(f"round {r}: the router never reported the failure")
                    await asyncio.sleep(0.005)
                t1 = time.perf_counter()
                await admin.Drain(pool_pb2.DrainRequest(worker=failing, timeout_seconds=10))
                new, epoch = r + 2, epoch + 1  # ids 2, 3, ...: each replacement a new one
                grouping = [
                    pool_pb2.Slot(worker=0, degree=1, domain=0, offset=0),
                    pool_pb2.Slot(worker=new, degree=1, domain=0, offset=1),
                ]
                await admin.Switch(
                    pool_pb2.SwitchRequest(
                        epoch=epoch, domain=0, grouping=grouping, removed=[failing], kind="replace"
                    ),
                    timeout=60,
                )
                t2 = time.perf_counter()
                i = 0
                while True:  # until a prefill lands on the new worker
                    tokens = [(r * 997 + i * 31 + 7 * j) % 256 for j in range(40)]
                    a, b = await asyncio.gather(
                        prefill.Prefill(pool_pb2.PrefillRequest(request_id=f"{r}a{i}", token_ids=tokens)),
                        prefill.Prefill(pool_pb2.PrefillRequest(request_id=f"{r}b{i}", token_ids=tokens[::-1])),
                    )  # fmt: skip
                    if new in (a.worker, b.worker):
                        break
                    i += 1
                t3 = time.perf_counter()
                out.append({"detect_s": t1 - t0, "replace_s": t2 - t1, "first_answer_s": t3 - t2})
                print(
                    f"round {r}: detect {t1 - t0:.3f} s, replace {t2 - t1:.3f} s, "
                    f"first answer {t3 - t2:.3f} s",
                    file=sys.stderr,
                )
                failing = new
    finally:
        await running.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp)
        (model / "config.json").write_text(json.dumps({"vocab_size": 256}))
        proc, grpc_base, http_base = start_adapter(model, model / "adapter.log")
        try:
            data = asyncio.run(rounds(f"127.0.0.1:{grpc_base}", http_base, args.rounds))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    summary = {
        key: {
            "median": round(statistics.median(d[key] for d in data), 4),
            "max": round(max(d[key] for d in data), 4),
        }
        for key in ("detect_s", "replace_s", "first_answer_s")
    }
    result = {"date": time.strftime("%Y-%m-%d"), "rounds": data, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
