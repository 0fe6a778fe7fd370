"""Real processes for the pool's end-to-end tests: CP engines, routers, Redis, clients.

Everything here is a real process or a real server on loopback: engines are
``vertumnus serve`` subprocesses (the seeded tiny model on CPU ranks, gloo),
routers are either started in the test's own event loop (``start_router``)
or as ``vertumnus router`` subprocesses (to kill them), Redis is Debian's
``redis-server`` (``tests/redis_server.py``). ``e2e/conftest.py`` loads it as
``e2e_pool_support`` (``e2e`` is not a package): ``import e2e_pool_support as ps``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from vertumnus import admintoken
from vertumnus._proto import pool_pb2, pool_pb2_grpc, worker_pb2, worker_pb2_grpc
from vertumnus.admintls import AdminTLS
from vertumnus.ports import free_port_base as free_base

ROOT = Path(__file__).resolve().parents[1]


def load_redis_helper():  # type: ignore[no-untyped-def]
    """``tests/redis_server.py`` (RedisServer, redis_server_binary, with_parent_death)."""
    name = "vertumnus_tests_redis_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "redis_server.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class Engine:
    """One ``vertumnus serve`` process: ``ranks`` ranks grouped as ``degrees``."""

    def __init__(
        self,
        ranks: int,
        degrees: Sequence[int],
        log: Path,
        *,
        worker_ids: Sequence[int] | None = None,
        block_size: int = 16,
        num_blocks: int = 512,
        max_tokens: int = 2048,
        base_port: int | None = None,
    ) -> None:
        self.ranks = ranks
        self.degrees = list(degrees)
        self.worker_ids = list(worker_ids) if worker_ids is not None else None
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_tokens = max_tokens
        self.base_port = base_port or free_base(ranks)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.base_port}"

    def rank_address(self, rank: int) -> str:
        return f"127.0.0.1:{self.base_port + rank}"

    def command(self) -> list[str]:
        """The engine's command line (a subclass runs another engine on the same ports)."""
        cmd = [
            sys.executable,
            "-m",
            "vertumnus",
            "serve",
            "--ranks",
            str(self.ranks),
            "--degrees",
            ",".join(map(str, self.degrees)),
            "--base-port",
            str(self.base_port),
            "--block-size",
            str(self.block_size),
            "--num-blocks",
            str(self.num_blocks),
            "--max-tokens",
            str(self.max_tokens),
        ]
        if self.worker_ids is not None:
            cmd += ["--worker-ids", ",".join(map(str, self.worker_ids))]
        return cmd

    def start(self, timeout_s: float = 180.0) -> Engine:
        """Start the process; return once rank 0 answers Describe (or fail naming the log)."""
        self.proc = subprocess.Popen(
            load_redis_helper().with_parent_death(self.command()),
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine exited ({self.proc.returncode}); see {self.log}")
                try:
                    stub.Describe(worker_pb2.DescribeRequest(), timeout=1.0)
                    return self
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"engine did not answer in {timeout_s} s; see {self.log}"
                        ) from None
                    time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL the engine and its rank processes (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def served(self, worker_rank: int) -> set[int]:
        """The blocks the worker led by ``worker_rank`` serves, by its own snapshot."""
        with grpc.insecure_channel(self.rank_address(worker_rank)) as ch:
            snap = worker_pb2_grpc.WorkerStub(ch).ListBlocks(
                worker_pb2.ListBlocksRequest(), timeout=10
            )
        return {b.key for b in snap.served}

    def flush(self, worker_rank: int) -> int:
        with grpc.insecure_channel(self.rank_address(worker_rank)) as ch:
            rep = worker_pb2_grpc.WorkerStub(ch).FlushCache(
                worker_pb2.FlushCacheRequest(), timeout=10
            )
        return rep.removed_blocks

    def first_token(self, worker_rank: int, tokens: Sequence[int], request_id: str) -> int:
        with grpc.insecure_channel(self.rank_address(worker_rank)) as ch:
            rep = worker_pb2_grpc.WorkerStub(ch).Prefill(
                worker_pb2.PrefillRequest(request_id=request_id, token_ids=list(tokens)), timeout=60
            )
        return rep.first_token_id


class RouterProcess:
    """A ``vertumnus router`` subprocess (for the tests that kill routers)."""

    def __init__(
        self,
        engines: Sequence[str],
        log: Path,
        *extra: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        admin_port: bool = False,
        admin_tls: AdminTLS | None = None,
    ) -> None:
        self.host = host
        self.admin_tls = admin_tls
        """How to verify its Admin port, when it serves TLS (router.json's adminTlsCertFile)."""
        self.port = port or free_base(3)
        self.metrics_port = self.port + 1
        self.admin_port = self.port + 2 if admin_port else self.port
        """The Admin API's port: its own (``--admin-listen``, as in a deployment), or the
        public one's (also when a router.json names an ``adminPort``)."""
        self.engines = list(engines)
        self.extra = list(extra)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def admin_address(self) -> str:
        return f"{self.host}:{self.admin_port}"

    def start(self, timeout_s: float = 60.0) -> RouterProcess:
        return self.spawn().wait_ready(timeout_s)

    def spawn(self) -> RouterProcess:
        """Start the process without waiting. Call it from a thread that outlives the
        router: the parent-death signal fires when the *thread* that started the
        child ends (a worker thread of asyncio.to_thread would kill it with itself)."""
        cmd = [
            sys.executable,
            "-m",
            "vertumnus",
            "router",
            "--listen",
            self.address,
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
            "--admin-listen",
            self.admin_address if self.admin_port != self.port else "",
            *self.extra,
        ]
        for e in self.engines:
            cmd += ["--engine", e]
        self.proc = subprocess.Popen(
            load_redis_helper().with_parent_death(cmd),
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> RouterProcess:
        """Block until the router answers GetPool, or refuses it for want of the Admin token
        (it serves Admin then too), or fail naming its log."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited ({self.proc.returncode}); see {self.log}")
            try:
                pool(self.admin_address, timeout=1.0, tls=self.admin_tls)
                return self
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
                    return self
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"router did not answer in {timeout_s} s; see {self.log}"
                    ) from None
                time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return None if self.proc is None else self.proc.returncode


def pool(
    target: str,
    timeout: float = 10.0,
    token_file: Path | None = None,
    tls: AdminTLS | None = None,
) -> pool_pb2.PoolStatus:
    """Admin.GetPool at ``target``, with the Admin token in ``token_file`` if given, over
    TLS verified with ``tls`` if given."""
    md = admintoken.bearer(admintoken.read_token(str(token_file))) if token_file else ()
    channel = (
        grpc.insecure_channel(target)
        if tls is None
        else grpc.secure_channel(target, tls.credentials(), tls.options())
    )
    with channel as ch:
        return pool_pb2_grpc.AdminStub(ch).GetPool(
            pool_pb2.GetPoolRequest(), timeout=timeout, metadata=md
        )


def prompts(
    n: int, *, shared: int = 32, extra: int = 24, seed: int = 0, vocab: int = 256
) -> list[list[int]]:
    """``n`` prompts: a few shared heads (``shared`` tokens) with tails of their own."""
    import random

    rng = random.Random(seed)
    heads = [[rng.randrange(vocab) for _ in range(shared)] for _ in range(4)]
    return [heads[i % 4] + [rng.randrange(vocab) for _ in range(extra + i % 7)] for i in range(n)]
