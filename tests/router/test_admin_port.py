"""The Admin API on a port of its own (``admin_listen``), as the operator's router pods
run it: clients reach Prefill on the public port and cannot drain or regroup the pool
there; the operator reaches Admin on the other. A real router on loopback, in front of
the scripted one-worker engine of ``test_dispatch``."""

from __future__ import annotations

import socket

import grpc
import pytest

from tests.router.test_dispatch import _pool, _send, _sync
from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.router.serve import start_router
from vertumnus.router.settings import RouterSettings


def _settings(**kw) -> RouterSettings:  # type: ignore[no-untyped-def]
    return RouterSettings(listen="127.0.0.1:0", metrics_listen="", cache_manager=None, **kw)


async def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code()


@_sync
async def test_admin_is_served_on_its_own_port_and_not_on_the_public_one() -> None:
    engine, running = await _pool(_settings(admin_listen="127.0.0.1:0"))
    try:
        assert running.admin_server is not None and running.admin_port != running.port
        async with (
            grpc.aio.insecure_channel(running.address) as public,
            grpc.aio.insecure_channel(running.admin_address) as admin,
        ):
            reply = await _send(pool_pb2_grpc.PrefillStub(public), "r0")
            assert reply.request_id == "r0"
            status = await pool_pb2_grpc.AdminStub(admin).GetPool(pool_pb2.GetPoolRequest())
            assert [w.worker for w in status.workers] == [0]
            # A client of the public port can neither read nor drain the pool ...
            drain = pool_pb2_grpc.AdminStub(public).Drain(pool_pb2.DrainRequest(worker=0))
            assert await _code(drain) == grpc.StatusCode.UNIMPLEMENTED
            get = pool_pb2_grpc.AdminStub(public).GetPool(pool_pb2.GetPoolRequest())
            assert await _code(get) == grpc.StatusCode.UNIMPLEMENTED
            # ... and the Admin port places no request.
            prefill = _send(pool_pb2_grpc.PrefillStub(admin), "r1")
            assert await _code(prefill) == grpc.StatusCode.UNIMPLEMENTED
            status = await pool_pb2_grpc.AdminStub(admin).GetPool(pool_pb2.GetPoolRequest())
            assert status.workers[0].state == pool_pb2.WorkerStatus.SERVING  # never drained
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)
    # Both ports are closed by stop().
    for port in (running.port, running.admin_port):
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass


@_sync
async def test_without_an_admin_port_admin_is_served_beside_prefill() -> None:
    engine, running = await _pool(_settings())
    try:
        assert running.admin_server is None and running.admin_address == running.address
        async with grpc.aio.insecure_channel(running.address) as ch:
            status = await pool_pb2_grpc.AdminStub(ch).GetPool(pool_pb2.GetPoolRequest())
            assert [w.worker for w in status.workers] == [0]
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_an_admin_port_in_use_is_refused_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=f"cannot listen on {busy}"):
            await start_router(_settings(admin_listen=busy), ["127.0.0.1:1"], discover_timeout_s=1)


def test_the_admin_port_must_not_be_the_public_one() -> None:
    with pytest.raises(ValueError, match="admin_listen: '0.0.0.0:50050' has the public API's"):
        RouterSettings(listen="0.0.0.0:50050", admin_listen="0.0.0.0:50050")
    with pytest.raises(ValueError, match="admin_listen: expected HOST:PORT"):
        RouterSettings(admin_listen="50060")
