"""The router's per-worker dispatch: one request running, one forwarded ahead.

A scripted one-rank engine (the worker protocol of ``bench/instant_engine.py``
with chosen service times and failures, on a real gRPC server on loopback)
stands behind a real router. The end-to-end suites (``e2e/``) run the same
paths against real CP engines; these tests pin the orderings that are hard to
provoke there: a reply for the request waiting ahead arriving before the
running one's, and failures of either.
"""

from __future__ import annotations

import asyncio
import functools

import grpc
import pytest

from tests.conftest import bench_script
from vertumnus._proto import pool_pb2, pool_pb2_grpc, worker_pb2_grpc
from vertumnus.router.serve import start_router
from vertumnus.router.settings import RouterSettings


def _instant():
    return bench_script("instant_engine.py")


class Scripted:
    """A one-worker engine whose Prefill takes ``delays[id]`` seconds (and fails once
    for the ids in ``fail``)."""

    def __init__(self) -> None:
        self.engine = _instant().InstantEngine(1, [1])
        self.delays: dict[str, float] = {}
        self.fail: set[str] = set()
        self.at_once = 0
        self.most_at_once = 0
        self.order: list[str] = []
        self.refuse_resume = False
        """Drain(resume) fails UNAVAILABLE (an engine still starting)."""

    async def start(self) -> str:
        outer = self

        class Servicer(_instant()._Servicer):  # type: ignore[misc,name-defined]
            async def Drain(self, request, context):  # type: ignore[no-untyped-def]
                if request.resume and outer.refuse_resume:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
                return await super().Drain(request, context)

            async def Prefill(self, request, context):  # type: ignore[no-untyped-def]
                outer.at_once += 1
                outer.most_at_once = max(outer.most_at_once, outer.at_once)
                outer.order.append(request.request_id)
                try:
                    await asyncio.sleep(outer.delays.get(request.request_id, 0.0))
                    if request.request_id in outer.fail:
                        outer.fail.discard(request.request_id)  # fails once
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted failure")
                    return await super().Prefill(request, context)
                finally:
                    outer.at_once -= 1

        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        worker_pb2_grpc.add_WorkerServicer_to_server(Servicer(self.engine, 0), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"


async def _pool(settings: RouterSettings | None = None):  # type: ignore[no-untyped-def]
    engine = Scripted()
    address = await engine.start()
    running = await start_router(
        settings or RouterSettings(listen="127.0.0.1:0", metrics_listen="", cache_manager=None),
        [address],
        discover_timeout_s=20,
    )
    return engine, running


def _sync(test):  # type: ignore[no-untyped-def]
    """Run an async test on a fresh event loop (with a bound on its time)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(asyncio.wait_for(test(), 60))

    return run


def _core_is_clean(running) -> None:  # type: ignore[no-untyped-def]
    w = running.router.core.worker(0)
    assert (w.queued, w.running) == (0, 0)
    assert running.router.core.placed_requests() == []
    assert running.router.in_flight() == 0


async def _send(stub, rid: str, n: int = 40):  # type: ignore[no-untyped-def]
    return await stub.Prefill(
        pool_pb2.PrefillRequest(request_id=rid, token_ids=list(range(n))), timeout=20
    )


@_sync
async def test_one_runs_and_one_waits_at_the_worker() -> None:
    engine, running = await _pool()
    try:
        engine.delays = {f"r{i}": 0.05 for i in range(6)}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            replies = await asyncio.gather(*(_send(stub, f"r{i}", 40 + i) for i in range(6)))
        assert [r.request_id for r in replies] == [f"r{i}" for i in range(6)]
        assert engine.most_at_once == 2  # never more than one waiting behind the running one
        _core_is_clean(running)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_without_forward_ahead_the_worker_gets_one_at_a_time() -> None:
    settings = RouterSettings(
        listen="127.0.0.1:0", metrics_listen="", cache_manager=None, forward_ahead=False
    )
    engine, running = await _pool(settings)
    try:
        engine.delays = {f"r{i}": 0.03 for i in range(4)}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            await asyncio.gather(*(_send(stub, f"r{i}", 40 + i) for i in range(4)))
        assert engine.most_at_once == 1
        _core_is_clean(running)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_the_waiting_request_answered_first_is_accounted_in_order() -> None:
    engine, running = await _pool()
    try:
        # r0 runs long; r1, forwarded behind it, is answered first (as when one
        # engine step served both and r0's reply is late).
        engine.delays = {"r0": 0.3, "r1": 0.0}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            t0 = asyncio.create_task(_send(stub, "r0"))
            await asyncio.sleep(0.1)
            r1 = await _send(stub, "r1", 41)
            assert not t0.done()  # r1's answer did not wait for r0's
            await t0
            assert r1.request_id == "r1"
        _core_is_clean(running)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_a_failed_running_request_is_placed_again_and_the_waiting_one_runs() -> None:
    engine, running = await _pool()
    try:
        engine.delays = {"r0": 0.1, "r1": 0.05}
        engine.fail = {"r0"}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            t0 = asyncio.create_task(_send(stub, "r0"))
            await asyncio.sleep(0.03)
            t1 = asyncio.create_task(_send(stub, "r1", 41))
            r0, r1 = await asyncio.gather(t0, t1)
        assert r0.attempts == 2 and r1.attempts == 1
        _core_is_clean(running)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_a_failed_waiting_request_leaves_the_running_one_alone() -> None:
    engine, running = await _pool()
    try:
        engine.delays = {"r0": 0.2, "r1": 0.0}
        engine.fail = {"r1"}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            t0 = asyncio.create_task(_send(stub, "r0"))
            await asyncio.sleep(0.05)
            t1 = asyncio.create_task(_send(stub, "r1", 41))
            r0, r1 = await asyncio.gather(t0, t1)
        assert r0.attempts == 1 and r1.attempts == 2
        _core_is_clean(running)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_requests_with_a_ttft_target_are_counted_by_whether_they_met_it() -> None:
    engine, running = await _pool()
    try:
        engine.delays = {"slow": 0.05}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            for rid, slo in (("fast", 30.0), ("slow", 0.01), ("none", 0.0)):
                await stub.Prefill(
                    pool_pb2.PrefillRequest(
                        request_id=rid, token_ids=list(range(40)), ttft_slo_seconds=slo
                    ),
                    timeout=20,
                )
        reg = running.router.metrics.registry
        met = reg.get_sample_value("vertumnus_router_slo_requests_total", {"met": "true"})
        missed = reg.get_sample_value("vertumnus_router_slo_requests_total", {"met": "false"})
        assert (met, missed) == (1.0, 1.0)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_the_window_report_lists_first_placements_up_to_its_limit() -> None:
    # An operator-run pool's router lists each hop's first placements for the
    # operator's what-if check, at most report_requests of them; the rest it counts.
    settings = RouterSettings(
        listen="127.0.0.1:0", metrics_listen="", cache_manager=None, report_requests=3
    )
    engine, running = await _pool(settings)
    try:
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            for i in range(5):
                await _send(stub, f"r{i}", 40 + i)
            admin = pool_pb2_grpc.AdminStub(ch)
            report = await admin.TakeWindow(pool_pb2.TakeWindowRequest(hop=1), timeout=10)
            again = await admin.TakeWindow(pool_pb2.TakeWindowRequest(hop=1), timeout=10)
            after = await admin.TakeWindow(pool_pb2.TakeWindowRequest(hop=2), timeout=10)
        from vertumnus.operator.routerapi import placed_rows

        rows = placed_rows(report)  # as the operator reads them (packed columns)
        assert report.requests == 5 and not report.placed
        assert [length for _, length, _, _, _ in rows] == [40, 41, 42]
        assert report.placed_left_out == 2
        assert all(len(keys) == length // 16 for _, length, _, keys, _ in rows)
        # Each row names the worker it went to, one of the pool's.
        assert {worker for *_, worker in rows} <= set(running.router.workers)
        offsets = [offset for offset, _, _, _, _ in rows]
        assert offsets == sorted(offsets) and offsets[0] >= 0.0
        assert again == report  # a retried take answers the same
        assert (placed_rows(after), after.placed_left_out) == ([], 0)
        # The workers' cache size, for the operator's shadow pools: the engine's, per GPU.
        info = running.router.engine_info[0]
        assert info.cache_blocks_per_rank > 0
        assert report.cache_blocks_per_gpu == info.cache_blocks_per_rank
    finally:
        await running.stop()
        await engine.server.stop(None)


def test_report_requests_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="report_requests"):
        RouterSettings(report_requests=-1)


@_sync
async def test_the_collectors_pauses_are_exported_while_the_router_runs() -> None:
    import gc

    engine, running = await _pool()
    try:
        gc.collect()
        running.router.metrics.snapshot(running.router)
        reg = running.router.metrics.registry
        full = reg.get_sample_value("vertumnus_process_gc_pause_seconds_count", {"generation": "2"})
        assert full is not None and full >= 1.0
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)
    # Closed: the router times no more collections.
    gc.collect()
    assert running.router.metrics.gc_pauses.drain() == []


@_sync
async def test_a_resume_the_engine_refuses_keeps_the_worker_drained_and_loses_nothing() -> None:
    # A rolling update resumes a worker whose engine may still be starting: until the
    # engine admits again, requests wait for it (they do not fail as unplaceable).
    engine, running = await _pool()
    try:
        async with grpc.aio.insecure_channel(running.address) as ch:
            admin = pool_pb2_grpc.AdminStub(ch)
            stub = pool_pb2_grpc.PrefillStub(ch)
            drained = await admin.Drain(pool_pb2.DrainRequest(worker=0), timeout=10)
            assert drained.drained
            waiting = asyncio.ensure_future(_send(stub, "held", 40))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            engine.refuse_resume = True
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Drain(pool_pb2.DrainRequest(worker=0, resume=True), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "did not resume" in (err.value.details() or "")
            pool = await admin.GetPool(pool_pb2.GetPoolRequest(), timeout=10)
            assert pool.workers[0].state == pool_pb2.WorkerStatus.DRAINING
            await asyncio.sleep(0.2)
            assert not waiting.done()  # still held, not failed
            engine.refuse_resume = False
            await admin.Drain(pool_pb2.DrainRequest(worker=0, resume=True), timeout=10)
            reply = await waiting
            assert reply.request_id == "held"
        _core_is_clean(running)
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@_sync
async def test_a_stopping_router_answers_what_it_holds_and_refuses_new_requests() -> None:
    # A SIGTERM (a rollout of the router) while a long prefill runs and another waits
    # behind it: both are answered; a request that comes after is refused.
    engine, running = await _pool()
    try:
        engine.delays = {"long": 1.5, "behind": 0.2}
        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)
            long = asyncio.ensure_future(_send(stub, "long", 40))
            behind = asyncio.ensure_future(_send(stub, "behind", 41))
            await asyncio.sleep(0.2)
            stopping = asyncio.ensure_future(running.stop(10.0))
            await asyncio.sleep(0.2)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _send(stub, "late", 42)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (await long).request_id == "long"
            assert (await behind).request_id == "behind"
            await stopping
    finally:
        await engine.server.stop(0)
