"""``vertumnus up``: a whole pool on one machine — CP engines, router, controller, store.

It starts one ``vertumnus serve`` engine process per NVLink domain (``ranks``
CPU ranks each, the seeded tiny model, grouped as ``composition``), the
router in this process with the composition controller in-process, and the
in-process prefix index (or Redis: ``--redis`` starts a ``redis-server``,
``--redis-url`` uses one), prints where to connect and where the metrics
are, and runs until Ctrl-C, then drains and stops everything and exits 0.

``--demo`` also drives a bundled synthetic workload through the pool for
about a minute with a live progress bar, forces one split and one merge on
the way, and ends with a TTFT table, a picture and the reconfiguration
timeline.

This module composes the shells (it may import the router, the simulator's
trace generator and the load client); nothing imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vertumnus.core.types import Composition

__all__ = ["LocalPool", "PoolSpec", "engine_degrees"]


def engine_degrees(composition: Composition, ranks: int) -> list[list[int]]:
    """Per engine (domain of ``ranks`` ranks), its workers' degrees left to right,
    largest first so every worker starts at a multiple of its degree."""
    for d in set(composition.degrees):
        if d & (d - 1) or d > ranks:
            raise ValueError(f"degree {d} is not a power of two that fits a {ranks}-rank domain")
    if composition.gpus % ranks:
        raise ValueError(
            f"composition {composition} uses {composition.gpus} ranks, not a multiple of "
            f"--ranks {ranks} per domain"
        )
    from vertumnus.core.lattice import layout_for

    layout = layout_for(composition, ranks)
    out: list[list[int]] = [[] for _ in range(composition.gpus // ranks)]
    for s in layout.slots:  # sorted by (domain, offset)
        out[s.domain].append(s.degree)
    return out


@dataclass
class PoolSpec:
    """What ``vertumnus up`` starts."""

    composition: Composition = field(default_factory=lambda: Composition.parse("2xCP2+1xCP4"))
    ranks: int = 8
    """Ranks per engine (an NVLink domain's GPUs)."""
    host: str = "127.0.0.1"
    port: int = 50050
    """The router's public port (Prefill + Admin)."""
    metrics_port: int = 9464
    engine_port: int = 50100
    """First port of the first engine; engine d uses ``engine_port + d·ranks + rank``."""
    block_size: int = 16
    num_blocks: int = 1024
    max_tokens: int = 8192
    profile: str = "cpu-tiny"
    controller: bool = True
    redis: bool = False
    redis_url: str | None = None


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class LocalPool:
    """The processes of a local pool, started and stopped together."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.engines: list[subprocess.Popen[bytes]] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.running = None
        self._tmp = tempfile.TemporaryDirectory(prefix="vertumnus-up-")
        self.logs = Path(self._tmp.name)

    def engine_addresses(self) -> list[str]:
        n = self.spec.composition.gpus // self.spec.ranks
        return [f"{self.spec.host}:{self.spec.engine_port + d * self.spec.ranks}" for d in range(n)]

    def check_ports(self) -> None:
        s = self.spec
        wanted = [("router", s.port), ("metrics", s.metrics_port)] + [
            (f"engine {d} rank {r}", s.engine_port + d * s.ranks + r)
            for d in range(s.composition.gpus // s.ranks)
            for r in range(s.ranks)
        ]
        busy = [f"{what} port {port}" for what, port in wanted if port and not _free(s.host, port)]
        if busy:
            raise OSError(
                f"ports in use: {', '.join(busy)} (another pool running? pick others with --port/--engine-port)"
            )

    def start_engines(self) -> None:
        s = self.spec
        for d, degrees in enumerate(engine_degrees(s.composition, s.ranks)):
            # Pool-level ids, unique over the domains: the global first rank.
            offsets = [sum(degrees[:i]) for i in range(len(degrees))]
            ids = [d * s.ranks + o for o in offsets]
            cmd = [
                sys.executable,
                "-m",
                "vertumnus",
                "serve",
                "--ranks",
                str(s.ranks),
                "--degrees",
                ",".join(map(str, degrees)),
                "--base-port",
                str(s.engine_port + d * s.ranks),
                "--block-size",
                str(s.block_size),
                "--num-blocks",
                str(s.num_blocks),
                "--max-tokens",
                str(s.max_tokens),
                "--worker-ids",
                ",".join(map(str, ids)),
                # An `up` killed outright (SIGKILL, OOM) takes its engines with it.
                "--exit-with",
                str(os.getpid()),
            ]
            log = (self.logs / f"engine-{d}.log").open("wb")
            self.engines.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def start_redis(self) -> str:
        exe = shutil.which("redis-server")
        if exe is None:
            raise OSError(
                "--redis needs redis-server (Debian: apt-get install redis-server), or use --redis-url"
            )
        with socket.socket() as sock:
            sock.bind((self.spec.host, 0))
            port = sock.getsockname()[1]
        self.redis = subprocess.Popen(
            [
                exe,
                "--port",
                str(port),
                "--bind",
                self.spec.host,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.logs),
            ],
            stdout=(self.logs / "redis.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return f"redis://{self.spec.host}:{port}/0"

    async def start(self) -> Any:
        from vertumnus.core.planner import PlannerSettings
        from vertumnus.router.serve import start_router
        from vertumnus.router.settings import RouterSettings

        s = self.spec
        self.check_ports()
        self.start_engines()
        store = None
        redis_url = s.redis_url
        if s.redis:
            redis_url = self.start_redis()
        settings = RouterSettings(
            listen=f"{s.host}:{s.port}",
            metrics_listen=f"{s.host}:{s.metrics_port}" if s.metrics_port else "",
            profile=s.profile,
            controller=PlannerSettings(domain_size=s.ranks, degrees=(1, 2, 4), window_s=10.0)
            if s.controller
            else None,
        )
        if redis_url is not None:
            from vertumnus.router.mirror import redis_store_for

            store = redis_store_for(redis_url, settings.pool, s.profile)
        try:
            self.running = await start_router(
                settings, self.engine_addresses(), store=store, discover_timeout_s=120.0
            )
        except BaseException:
            self.stop_processes()
            raise
        return self.running

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()
            self.running = None
        self.stop_processes()

    def stop_processes(self) -> None:
        for p in self.engines:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        for p in self.engines:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.engines.clear()
        if self.redis is not None and self.redis.poll() is None:
            self.redis.terminate()
            self.redis.wait(10)
        self.redis = None

    def engine_log_tail(self, lines: int = 20) -> str:
        out = []
        for f in sorted(self.logs.glob("engine-*.log")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(out)


async def up(spec: PoolSpec, demo: bool = False, demo_json: str | None = None) -> int:
    pool = LocalPool(spec)
    try:
        running = await pool.start()
    except (OSError, ValueError) as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        tail = pool.engine_log_tail()
        if tail.strip():
            print(tail, file=sys.stderr)
        return 2
    except Exception as e:  # the router could not reach its engines
        print(f"vertumnus: error: the pool did not start: {e}", file=sys.stderr)
        print(pool.engine_log_tail(), file=sys.stderr)
        pool.stop_processes()
        return 1
    router = running.router
    print(
        f"vertumnus up: {router.composition()} on {len(pool.engines)} engine(s) of {spec.ranks} CPU ranks, "
        f"epoch {router.pool.epoch}, store {router.store_kind}\n"
        f"  connect:  {running.address}   (vertumnus.v1.Prefill / vertumnus.v1.Admin; "
        f"try: vertumnus admin pool --target {running.address})\n"
        f"  metrics:  http://{spec.host}:{running.metrics_port}/metrics\n"
        f"  logs:     {pool.logs}\n"
        "  Ctrl-C stops the pool.",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        if demo:
            from vertumnus.demo import run_demo

            code = await run_demo(running, stop, demo_json)
        else:
            await stop.wait()
    finally:
        print("vertumnus up: stopping (draining the workers)", flush=True)
        await pool.stop()
    return code


# -- the command ----------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="run a whole pool on this machine: CPU engines, router, controller",
        description=(
            "Start CP engines of the seeded tiny model on CPU ranks, the router with the composition "
            "controller in-process, and the prefix index (in process, or Redis); print where to connect; "
            "run until Ctrl-C. --demo drives a minute of traffic through it with one split and one merge."
        ),
    )
    p.add_argument(
        "--composition", default="2xCP2+1xCP4", help="the workers, e.g. 2xCP2+1xCP4 (default)"
    )
    p.add_argument(
        "--ranks", type=int, default=8, help="CPU ranks per engine (an NVLink domain; default 8)"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address everything listens on (default 127.0.0.1)"
    )
    p.add_argument("--port", type=int, default=50050, help="the router's port (default 50050)")
    p.add_argument(
        "--metrics-port", type=int, default=9464, help="/metrics port (default 9464; 0 for none)"
    )
    p.add_argument(
        "--engine-port", type=int, default=50100, help="first engine port (default 50100)"
    )
    p.add_argument(
        "--profile",
        default="cpu-tiny",
        help="prefill-time profile for placement (default cpu-tiny)",
    )
    p.add_argument(
        "--no-controller",
        action="store_true",
        help="no composition controller: the composition changes only on `vertumnus admin split|merge`",
    )
    store = p.add_mutually_exclusive_group()
    store.add_argument(
        "--redis", action="store_true", help="start a redis-server for the prefix index and load"
    )
    store.add_argument(
        "--redis-url",
        default=None,
        help="use this Redis (password from VERTUMNUS_REDIS_PASSWORD(_FILE))",
    )
    p.add_argument(
        "--demo",
        action="store_true",
        help="drive a minute of traffic with a split and a merge, then stop",
    )
    p.add_argument(
        "--demo-json",
        default=None,
        help="with --demo: write the results here (and a .png beside it)",
    )
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        default="text",
        help="router log lines (default text)",
    )
    p.set_defaults(func=cmd_up)


def cmd_up(args: Any) -> int:
    from vertumnus.router.logs import configure_logging

    try:
        composition = Composition.parse(args.composition)
        spec = PoolSpec(
            composition=composition,
            ranks=args.ranks,
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port,
            engine_port=args.engine_port,
            profile=args.profile,
            controller=not args.no_controller,
            redis=args.redis,
            redis_url=args.redis_url,
        )
        engine_degrees(composition, args.ranks)
        for port, what in ((args.port, "--port"), (args.engine_port, "--engine-port")):
            if not 1 <= port <= 65535:
                raise ValueError(f"{what} {port} is not a port (1..65535)")
    except ValueError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    configure_logging(args.log_format)
    try:
        return asyncio.run(up(spec, demo=args.demo, demo_json=args.demo_json))
    except KeyboardInterrupt:
        return 0
