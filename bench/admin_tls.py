"""What TLS and the token cost the operator's Admin calls: plaintext against TLS, side by side.

    python bench/admin_tls.py [--hops 15] [--placements 1500] [--json OUT]

Two routers run in this process in front of one engine that answers at once
(``bench/instant_engine.py``), both with the Admin token; one serves its Admin port in
plaintext, the other over TLS with a certificate issued the operator's way
(:mod:`vertumnus.admintls`). Each hop, ``--placements`` prefills go through each router,
then the operator's client (:class:`vertumnus.operator.routerapi.RouterAdmin`) takes the
hop's window from both, in alternating order: ``TakeWindow`` carries every first
placement of the hop (arrival, length, cached tokens, block keys), the largest message
the operator reads. ``GetPool`` (a small one) is timed the same way, 20 calls a hop.
The routers and the client share this process's event loop, so each hop's calls wait
``--settle`` seconds for the routers to finish the hop's cache events.
Also reported: the first call on a new channel (connection, and the TLS handshake).

Reported: median and p90 client wall time per call, per mode, and their ratios; the
index's size at the end (``GetPool`` once scanned it per worker: 2026-12-06).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sim_to_real import _free_base  # noqa: E402  (one port helper for the benches)


def _ca() -> tuple[bytes, bytes]:
    from vertumnus.admintls import new_ca

    return new_ca("bench-ca", datetime.datetime.now(datetime.UTC), days=30)


def _quantiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "median_ms": round(1e3 * statistics.median(s), 3),
        "p90_ms": round(1e3 * s[min(len(s) - 1, int(0.9 * len(s)))], 3),
        "n": len(s),
    }


async def _run(args: argparse.Namespace, folder: Path) -> dict[str, object]:
    import random

    import grpc

    from vertumnus import admintls
    from vertumnus._proto import pool_pb2, pool_pb2_grpc
    from vertumnus.operator.routerapi import RouterAdmin
    from vertumnus.router.serve import start_router
    from vertumnus.router.settings import RouterSettings

    base = _free_base(8)
    engine = subprocess.Popen(
        [sys.executable, str(ROOT / "instant_engine.py"), "--ranks", "8", "--degrees", "4,2,2",
         "--base-port", str(base)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    (folder / "token").write_text("bench-token\n")
    ca = _ca()
    name = admintls.router_name("bench", "default")
    issued = admintls.issue(ca[0], ca[1], name, datetime.datetime.now(datetime.UTC))
    (folder / "tls.crt").write_bytes(issued.cert_pem)
    (folder / "tls.key").write_bytes(issued.key_pem)
    routers = {}
    try:
        for mode in ("plaintext", "tls"):
            tls = mode == "tls"
            settings = RouterSettings(
                listen="127.0.0.1:0",
                admin_listen="127.0.0.1:0",
                metrics_listen="",
                admin_token_file=str(folder / "token"),
                admin_tls_cert_file=str(folder / "tls.crt") if tls else "",
                admin_tls_key_file=str(folder / "tls.key") if tls else "",
                external_controller=True,
            )
            routers[mode] = await start_router(
                settings, [f"127.0.0.1:{base}"], discover_timeout_s=60, router_id=mode
            )
        verify = {"plaintext": None, "tls": admintls.AdminTLS(ca[0], name)}
        rng = random.Random(0)
        heads = [[rng.randrange(256) for _ in range(256)] for _ in range(32)]
        first: dict[str, list[float]] = {m: [] for m in routers}
        take: dict[str, list[float]] = {m: [] for m in routers}
        get: dict[str, list[float]] = {m: [] for m in routers}
        sizes: list[int] = []
        for hop in range(1, args.hops + 1):
            for running in routers.values():
                async with grpc.aio.insecure_channel(running.address) as ch:
                    stub = pool_pb2_grpc.PrefillStub(ch)
                    for start in range(0, args.placements, 64):
                        await asyncio.gather(
                            *(
                                stub.Prefill(
                                    pool_pb2.PrefillRequest(
                                        request_id=f"h{hop}-{i}",
                                        token_ids=heads[i % 32]
                                        + [rng.randrange(256) for _ in range(64)],
                                    )
                                )
                                for i in range(start, min(start + 64, args.placements))
                            )
                        )
            # The routers and this client share one event loop: let the routers finish the
            # hop's cache events first, so that only the calls are timed.
            await asyncio.sleep(args.settle)
            order = list(routers) if hop % 2 else list(reversed(routers))
            for mode in order:
                admin = RouterAdmin([routers[mode].admin_address], "bench-token", verify[mode])
                try:
                    t = time.perf_counter()
                    await admin.draining_workers()
                    first[mode].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    window = await admin.take_window(hop)
                    take[mode].append(time.perf_counter() - t)
                    sizes.append(len(window.placed))
                    for _ in range(20):
                        t = time.perf_counter()
                        await admin.draining_workers()
                        get[mode].append(time.perf_counter() - t)
                finally:
                    await admin.close()
        out: dict[str, object] = {
            "placements_per_take": statistics.median(sizes),
            "index_blocks_at_the_end": len(routers["tls"].router.store),
            "take_window": {m: _quantiles(v) for m, v in take.items()},
            "get_pool": {m: _quantiles(v) for m, v in get.items()},
            "first_call_on_a_new_channel": {m: _quantiles(v) for m, v in first.items()},
        }
        out["ratios_tls_over_plaintext"] = {
            k: round(out[k]["tls"]["median_ms"] / out[k]["plaintext"]["median_ms"], 2)  # type: ignore[index]
            for k in ("take_window", "get_pool", "first_call_on_a_new_channel")
        }
        return out
    finally:
        for running in routers.values():
            await running.stop(1.0)
        engine.terminate()
        engine.wait(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hops", type=int, default=15)
    p.add_argument("--placements", type=int, default=1500, help="prefills per router per hop")
    p.add_argument(
        "--settle", type=float, default=1.5, help="seconds the routers get after a hop's prefills"
    )
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    if args.hops < 2 or args.placements < 1:
        p.error("--hops must be >= 2 and --placements >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(_run(args, Path(tmp)))
    out = {"command": "python bench/admin_tls.py " + " ".join(argv or sys.argv[1:]), **out}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
