"""The router's gRPC face: the public ``Prefill`` and ``Admin`` services, health, reflection.

Thin: each RPC validates what the router does not (message shapes), calls
the :class:`~vertumnus.router.router.Router`, and maps a
:class:`~vertumnus.router.router.RouterError` to its status code with the
message as is. Server reflection lets ``grpcurl`` list the services;
health (``grpc.health.v1``) says SERVING once the router is.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.core import planner
from vertumnus.core.lattice import Slot
from vertumnus.router.router import Router, RouterError

__all__ = ["AdminServicer", "PrefillServicer", "add_services"]

_STATES = {
    "serving": pool_pb2.WorkerStatus.SERVING,
    "draining": pool_pb2.WorkerStatus.DRAINING,
    "unreachable": pool_pb2.WorkerStatus.UNREACHABLE,
    "failed": pool_pb2.WorkerStatus.FAILED,
}


async def _abort(context: grpc.aio.ServicerContext, e: RouterError) -> None:
    await context.abort(e.code, e.message)


class PrefillServicer(pool_pb2_grpc.PrefillServicer):
    def __init__(self, router: Router) -> None:
        self.router = router

    async def Prefill(self, request, context):  # type: ignore[no-untyped-def]
        remaining = context.time_remaining()
        try:
            r = await self.router.prefill(
                request.request_id,
                list(request.token_ids),
                timeout_s=remaining if remaining is not None else None,
                ttft_slo_s=request.ttft_slo_seconds,
            )
        except RouterError as e:
            await _abort(context, e)
            raise  # not reached: abort raises
        return pool_pb2.PrefillResponse(
            request_id=r.request_id,
            first_token_id=r.first_token_id,
            worker=r.worker,
            degree=r.degree,
            epoch=r.epoch,
            cached_tokens=r.cached_tokens,
            queue_seconds=r.queue_seconds,
            execution_seconds=r.execution_seconds,
            ttft_seconds=r.ttft_seconds,
            attempts=r.attempts,
            predicted_seconds=r.predicted_seconds,
        )


class AdminServicer(pool_pb2_grpc.AdminServicer):
    def __init__(self, router: Router) -> None:
        self.router = router

    async def GetPool(self, request, context):  # type: ignore[no-untyped-def]
        router = self.router
        core = router.core
        if core is None or router.pool is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the router is starting")
        core.refresh(router.now())
        workers = []
        for state in core.workers:
            w = router.workers[state.id]
            kind = (
                "failed"
                if w.failure
                else "unreachable"
                if w.unreachable
                else "draining"
                if w.draining
                else "serving"
            )
            s = w.address.slot
            workers.append(
                pool_pb2.WorkerStatus(
                    worker=s.worker,
                    degree=s.degree,
                    domain=s.domain,
                    offset=s.offset,
                    state=_STATES[kind],
                    address=w.address.address,
                    outstanding_seconds=state.outstanding_s,
                    queued=state.queued,
                    running=state.running,
                    cached_blocks=router.store.worker_block_count(s.worker),
                    failure=w.failure,
                )
            )
        transitions = [
            pool_pb2.TransitionStatus(
                id=t.id,
                kind=t.kind,
                phase=t.phase.value,
                removed=list(t.members),
                added=[s.worker for s in t.added],
                epoch=t.epoch,
            )
            for t in router.pool.transitions
        ]
        return pool_pb2.PoolStatus(
            epoch=router.pool.epoch,
            composition=str(router.composition()),
            workers=workers,
            transitions=transitions,
            requests_in_flight=router.in_flight(),
            index_blocks=len(router.store),
            store=router.store_kind,
            store_degraded=router.store_degraded,
            router_id=router.router_id,
        )

    async def Drain(self, request, context):  # type: ignore[no-untyped-def]
        try:
            drained, replaced = await self.router.drain(
                request.worker,
                resume=request.resume,
                wait=not request.no_wait,
                timeout_s=request.timeout_seconds or None,
            )
        except RouterError as e:
            await _abort(context, e)
            raise
        return pool_pb2.DrainResponse(drained=drained, replaced=replaced)

    async def Switch(self, request, context):  # type: ignore[no-untyped-def]
        if request.kind not in ("split", "merge", "replace"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"kind: expected split, merge or replace, got {request.kind!r}",
            )
        grouping = [Slot(s.worker, s.degree, s.domain, s.offset) for s in request.grouping]
        try:
            seconds, added = await self.router.switch(
                request.epoch, request.domain, grouping, list(request.removed), request.kind
            )
        except RouterError as e:
            await _abort(context, e)
            raise
        return pool_pb2.SwitchResponse(epoch=request.epoch, switch_seconds=seconds, added=added)

    async def Reconfigure(self, request, context):  # type: ignore[no-untyped-def]
        which = request.WhichOneof("op")
        if which is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "op: give split or merge")
        if not self.router.runs_transitions:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this pool's transitions are run by its operator: ask there "
                "(kubectl annotate cppool NAME vertumnus.io/split=WORKER)",
            )
        op: planner.Op
        if which == "split":
            op = planner.Split(request.split, reason=request.reason or "requested")
            known = [request.split]
        else:
            op = planner.Merge(
                (request.merge.a, request.merge.b), reason=request.reason or "requested"
            )
            known = [request.merge.a, request.merge.b]
        for w in known:
            if w not in self.router.workers:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"{which}: worker {w} is not in the pool"
                )
        try:
            commit = await self.router.reconfigure(op)
        except RouterError as e:
            await _abort(context, e)
            raise
        record = self.router.transitions_done[-1]
        return pool_pb2.ReconfigureResponse(
            transition=commit.transition,
            added=commit.new_ids,
            drain_seconds=float(record["drain_s"]),
            switch_seconds=float(record["switch_s"]),
            epoch=commit.epoch,
        )

    async def Scan(self, request, context):  # type: ignore[no-untyped-def]
        try:
            copies, reclaims, tracked = self.router.scan()
        except RouterError as e:
            await _abort(context, e)
            raise
        return pool_pb2.ScanResponse(copies=copies, reclaims=reclaims, tracked_blocks=tracked)

    async def TakeWindow(self, request, context):  # type: ignore[no-untyped-def]
        if self.router.core is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the router is starting")
        hop, report, running, busy = self.router.take_window(request.hop)
        return pool_pb2.WindowReport(
            hop=hop,
            demand_seconds=report.demand_s,
            requests=report.requests,
            long_requests=report.long_requests,
            long_demand_seconds=report.long_demand_s,
            workers=[
                pool_pb2.WorkerLoad(
                    worker=w,
                    running_remaining_seconds=rest,
                    reused_blocks=report.reused.get(w, 0.0),
                )
                for w, rest in sorted(running.items())
            ],
            reconfiguring=busy,
            capacity=[
                pool_pb2.CapacityPart(
                    hop=c.hop,
                    degree=c.degree,
                    demand_seconds=c.demand_s,
                    requests=c.requests,
                    done=c.done,
                    tokens=c.tokens,
                    met_tokens=c.met_tokens,
                )
                for c in report.capacity
            ],
            placed_columns=_columns(report.listed),
            placed_left_out=report.left_out,
            cache_blocks_per_gpu=self.router.cache_blocks_per_gpu(),
        )


def add_services(
    server: grpc.aio.Server, router: Router, admin_server: grpc.aio.Server | None = None
) -> health.HealthServicer:
    """Register Prefill, health and reflection on ``server``, and Admin on ``admin_server``
    (with reflection of its own), or on ``server`` too when that is None."""
    pool_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(router), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    prefill = pool_pb2.DESCRIPTOR.services_by_name["Prefill"].full_name
    admin = pool_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
    pool_pb2_grpc.add_AdminServicer_to_server(AdminServicer(router), admin_server or server)
    if admin_server is None:
        names: tuple[str, ...] = (prefill, admin, health.SERVICE_NAME, reflection.SERVICE_NAME)
    else:
        names = (prefill, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection((admin, reflection.SERVICE_NAME), admin_server)
    reflection.enable_server_reflection(names, server)
    return health_servicer


def _columns(
    listed: Sequence[tuple[float, int, int, tuple[int, ...], int]],
) -> pool_pb2.PlacedColumns:
    """A hop's first placements as one message of packed columns: built on the event loop
    at every take, so a list per column rather than a message per placement (0.45× the
    time for 1,900 placements: bench/window_report.py)."""
    return pool_pb2.PlacedColumns(
        offset_seconds=[max(0.0, row[0]) for row in listed],
        length=[row[1] for row in listed],
        cached_tokens=[row[2] for row in listed],
        key_counts=[len(row[3]) for row in listed],
        block_keys=list(itertools.chain.from_iterable(row[3] for row in listed)),
        worker=[row[4] for row in listed],
    )


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
