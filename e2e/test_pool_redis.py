"""The pool with its prefix index in a real Redis: outages, two router replicas, router restarts.

Real ``redis-server`` (Debian's package), real engines, routers in the test's
event loop or as ``vertumnus router`` processes. Each test counts requests in
and out and says what was lost (nothing).
"""

from __future__ import annotations

import asyncio
import time

import e2e_pool_support as ps
import grpc
import pytest

from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.router.mirror import redis_store_for
from vertumnus.router.redis_conn import redis_client
from vertumnus.router.redis_store import RedisTrieStore
from vertumnus.router.serve import start_router
from vertumnus.router.settings import RouterSettings

rs = ps.load_redis_helper()
NAMESPACE = "local/cpu-tiny"  # what redis_store_for uses for pool "local", profile "cpu-tiny"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):  # type: ignore[no-untyped-def]
    e = ps.Engine(
        2, [1, 1], tmp_path_factory.mktemp("engine") / "engine.log", worker_ids=[0, 1]
    ).start()
    yield e
    e.stop()


@pytest.fixture()
def redis(tmp_path):  # type: ignore[no-untyped-def]
    rs.redis_server_binary()
    server = rs.RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def settings(**kw) -> RouterSettings:  # type: ignore[no-untyped-def]
    base = dict(
        listen=f"127.0.0.1:{ps.free_base(1)}",
        metrics_listen="",
        profile="cpu-tiny",
        store_retry_s=0.2,
    )
    base.update(kw)
    return RouterSettings(**base)


def shared_index(url: str) -> dict[int, set[int]]:
    """What Redis says each worker holds."""
    store = RedisTrieStore(redis_client(url), NAMESPACE)
    return {w: set(store.worker_keys(w)) for w in (0, 1)}


async def _send(stub, rid: str, tokens, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    return await stub.Prefill(
        pool_pb2.PrefillRequest(request_id=rid, token_ids=tokens), timeout=timeout
    )


async def _converged(probe, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        await asyncio.sleep(0.2)
    return probe()


def test_redis_killed_and_restarted_the_router_keeps_serving_and_the_index_converges(
    engine, redis
) -> None:
    items = ps.prompts(30, seed=10)

    async def scenario():  # type: ignore[no-untyped-def]
        store = redis_store_for(redis.url, "local", "cpu-tiny")
        running = await start_router(settings(), [engine.address], store=store)
        router = running.router
        truth = lambda: {w: engine.served(w) for w in (0, 1)}  # noqa: E731
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                for i, t in enumerate(items[:10]):
                    await _send(stub, f"r{i}", t)
                synced = await _converged(lambda: shared_index(redis.url) == truth())
                redis.kill()
                during = [await _send(stub, f"d{i}", t) for i, t in enumerate(items[10:20])]
                degraded = await _converged(lambda: router.store_degraded, 10)
                local_ok = {w: set(router.store.worker_keys(w)) for w in (0, 1)} == truth()
                redis.start()  # empty: no persistence
                after = [await _send(stub, f"a{i}", t) for i, t in enumerate(items[20:])]
                recovered = await _converged(
                    lambda: not router.store_degraded and shared_index(redis.url) == truth(), 20
                )
            return synced, during, degraded, local_ok, after, recovered, store.rewrites
        finally:
            await running.stop()

    synced, during, degraded, local_ok, after, recovered, rewrites = asyncio.run(scenario())
    assert synced  # Redis held exactly the workers' contents
    assert len(during) == 10 and len(after) == 10  # nothing lost while Redis was away
    assert degraded and local_ok  # degraded to the local view, which stayed true
    assert recovered and rewrites >= 1  # caught up: Redis converged to the workers' contents


def test_two_routers_on_one_redis_see_the_same_index(engine, redis) -> None:
    items = ps.prompts(24, seed=11, extra=200)

    async def scenario():  # type: ignore[no-untyped-def]
        a_store = redis_store_for(redis.url, "local", "cpu-tiny")
        b_store = redis_store_for(redis.url, "local", "cpu-tiny", follow=True)
        a = await start_router(settings(), [engine.address], store=a_store, router_id="a")
        b = await start_router(
            settings(index_source="store"), [engine.address], store=b_store, router_id="b"
        )
        seen_external = 0.0

        async def watch() -> None:
            nonlocal seen_external
            while True:
                b.router.core.refresh(b.router.now())
                seen_external = max(
                    seen_external, *(w.outstanding_s for w in b.router.core.workers)
                )
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        try:
            async with grpc.aio.insecure_channel(a.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                await asyncio.gather(*(_send(stub, f"x{i}", t) for i, t in enumerate(items)))
            same = await _converged(
                lambda: (
                    {w: set(b.router.store.worker_keys(w)) for w in (0, 1)}
                    == {w: set(a.router.store.worker_keys(w)) for w in (0, 1)}
                    and any(a.router.store.worker_keys(w) for w in (0, 1))
                )
            )
            views = {
                name: {w: sorted(x.router.store.worker_keys(w)) for w in (0, 1)}
                for name, x in (("a", a), ("b", b))
            }
            async with grpc.aio.insecure_channel(b.address) as ch:
                r = await _send(pool_pb2_grpc.PrefillStub(ch), "via-b", items[0])
            return same, seen_external, r, views
        finally:
            watcher.cancel()
            await b.stop()
            await a.stop()

    same, seen_external, r, views = asyncio.run(scenario())
    assert same, views  # B, following Redis, has A's index
    assert seen_external > 0  # B saw A's outstanding work through the load board
    assert r.cached_tokens > 0  # and places on it: a prefix A's requests left is a hit through B


def test_a_router_restarted_under_load_recovers_and_loses_nothing(engine, redis, tmp_path) -> None:
    items = ps.prompts(150, seed=12, extra=120)
    log = tmp_path / "router.log"
    router = ps.RouterProcess([engine.address], log, "--redis-url", redis.url).start()
    retried: list[str] = []
    answered: dict[str, int] = {}

    async def client(i: int, tokens) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(i * 0.02)
        rid = f"z{i}"
        for attempt in range(200):
            try:
                async with grpc.aio.insecure_channel(router.address) as ch:
                    r = await _send(pool_pb2_grpc.PrefillStub(ch), rid, tokens, timeout=30)
                answered[rid] = r.first_token_id
                return
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                if attempt == 0:
                    retried.append(rid)
                await asyncio.sleep(0.1)

    async def restart() -> float:
        await asyncio.sleep(1.0)
        router.kill()
        t0 = time.monotonic()
        router.spawn()  # in this thread, which outlives the router (see spawn)
        await asyncio.to_thread(router.wait_ready)
        return time.monotonic() - t0

    async def scenario():  # type: ignore[no-untyped-def]
        results = await asyncio.gather(restart(), *(client(i, t) for i, t in enumerate(items)))
        return results[0]

    try:
        down_s = asyncio.run(scenario())
        status = ps.pool(router.address)
        # The engine's last cache events and the router's writes to Redis are
        # asynchronous: the index converges to the workers' contents, within seconds.
        asyncio.run(
            _converged(
                lambda: shared_index(redis.url) == {w: engine.served(w) for w in (0, 1)}, 15.0
            )
        )
        index = shared_index(redis.url)
        truth = {w: engine.served(w) for w in (0, 1)}
        code = router.stop()
    finally:
        router.kill()
    assert len(answered) == len(items)  # every request answered (some after a retry)
    assert retried  # the restart really happened under load
    assert status.composition == "2xCP1" and status.store == "redis"
    assert index == truth  # rebuilt from Redis and the workers' snapshots: the workers' contents
    assert code == 0
    assert down_s < 60
