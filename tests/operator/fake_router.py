"""A stand-in for the router's Admin API: a real gRPC server on loopback, an in-memory pool.

Until ``vertumnus.router`` lands, the operator's tests (unit tests here, the e2e, and
``bench/operator_e2e.py``) talk to this server through the real ``vertumnus.v1.Admin``
service (``proto/vertumnus/v1/pool.proto``). It keeps a pool of workers that Switch
regroups, and has knobs a test turns:

- :meth:`FakeRouter.set_demand` — what each ``TakeWindow(hop)`` reports (the same report
  for a repeated hop, as the real API promises);
- :meth:`FakeRouter.fail_worker` — a worker GetPool reports FAILED (until replaced);
- ``drain_delay_s`` and :meth:`hold_drains` / :meth:`release_drains` — how long a Drain
  takes, or hold every drain until released (to kill an operator mid-transition);
- ``on_drain`` / ``on_switch`` — callbacks run inside the RPC (a unit test checks there
  that the phase was recorded before the call came).

It records every call (``drains``, ``resumes``, ``switches``, ``windows``) so a test can assert what
the operator did, e.g. that a transition's switch took effect exactly once
(:attr:`applied`: the switches that changed something). Load it by path where ``tests``
is not importable: ``load_fake_router()`` in e2e/bench code does that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from vertumnus._proto import pool_pb2, pool_pb2_grpc

__all__ = ["FakeRouter", "SwitchCall"]


@dataclass(frozen=True)
class SwitchCall:
    epoch: int
    domain: int
    grouping: tuple[tuple[int, int, int, int], ...]
    removed: tuple[int, ...]
    kind: str
    at: float
    effective: bool
    """False for a repeat (same epoch and grouping already in force): it changed nothing."""


@dataclass
class _Worker:
    degree: int
    domain: int
    offset: int
    state: int = pool_pb2.WorkerStatus.SERVING
    failure: str = ""


@dataclass
class FakeRouter(pool_pb2_grpc.AdminServicer):
    """``with FakeRouter() as r: r.address`` — serving on ``host`` (127.0.0.1), a free port."""

    host: str = "127.0.0.1"
    drain_delay_s: float = 0.0
    switch_delay_s: float = 0.0
    router_id: str = "fake-0"
    on_drain: Callable[[int], None] | None = None
    on_switch: Callable[[pool_pb2.SwitchRequest], None] | None = None
    workers: dict[int, _Worker] = field(default_factory=dict)
    drains: list[tuple[int, float]] = field(default_factory=list)
    resumes: list[tuple[int, float]] = field(default_factory=list)
    """Every Drain with ``resume`` (admit again): (worker, when)."""
    switches: list[SwitchCall] = field(default_factory=list)
    windows: dict[int, pool_pb2.WindowReport] = field(default_factory=dict)
    takes: list[tuple[int, float]] = field(default_factory=list)
    """Every TakeWindow call: (hop, when)."""
    epoch: int = 1
    fail_next_drain: grpc.StatusCode | None = None
    """The next Drain fails with this code (then serving resumes)."""
    fail_next_switch: grpc.StatusCode | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self._switch_released = threading.Event()
        self._switch_released.set()
        self._demand = (0.0, 0, 0, 0.0)
        self._placed: list[tuple[float, int, int, tuple[int, ...]]] = []
        self.cache_blocks_per_gpu = 0
        """What every report says of the workers' prefix caches (0: nothing)."""
        self._server: grpc.Server | None = None
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeRouter:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pool_pb2_grpc.add_AdminServicer_to_server(self, server)
        self.port = server.add_insecure_port(f"{self.host}:0")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self._released.set()
        self._switch_released.set()
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None

    def __enter__(self) -> FakeRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # ---- knobs -----------------------------------------------------------------------------

    def restart(self) -> None:
        """As a router replica that restarted: it rebuilt its workers from the engines, so
        what it had drained is serving again (a failed worker stays failed)."""
        with self._lock:
            for w in self.workers.values():
                if not w.failure:
                    w.state = pool_pb2.WorkerStatus.SERVING

    def set_demand(
        self, demand_s: float, requests: int = 0, long_requests: int = 0, long_demand_s: float = 0.0
    ) -> None:
        """What every hop from now on reports (seconds of predicted work per hop, etc.)."""
        with self._lock:
            self._demand = (demand_s, requests, long_requests, long_demand_s)

    def set_placed(self, rows: list[tuple[float, int, int, tuple[int, ...]]]) -> None:
        """The first placements every hop from now on lists (offset, length, cached, keys)."""
        with self._lock:
            self._placed = list(rows)

    def fail_worker(self, worker: int, why: str) -> None:
        """Report ``worker`` FAILED (its engine cannot serve it) until a Switch replaces it."""
        with self._lock:
            w = self.workers[worker]
            w.state, w.failure = pool_pb2.WorkerStatus.FAILED, why

    def hold_drains(self) -> None:
        self._released.clear()

    def release_drains(self) -> None:
        self._released.set()

    def hold_switches(self) -> None:
        """Every Switch waits (before it takes effect) until :meth:`release_switches`."""
        self._switch_released.clear()

    def release_switches(self) -> None:
        self._switch_released.set()

    def set_layout(self, slots: list[tuple[int, int, int, int]], epoch: int = 1) -> None:
        """(worker, degree, domain, offset) of every worker."""
        with self._lock:
            self.workers = {w: _Worker(d, dom, off) for w, d, dom, off in slots}
            self.epoch = epoch

    @property
    def applied(self) -> list[SwitchCall]:
        return [s for s in self.switches if s.effective]

    def composition(self) -> str:
        from vertumnus.core.types import Composition

        with self._lock:
            return str(Composition(tuple(w.degree for w in self.workers.values())))

    def _fail(self, context: grpc.ServicerContext, which: str) -> bool:
        with self._lock:
            code = getattr(self, f"fail_next_{which}")
            setattr(self, f"fail_next_{which}", None)
        if code is not None:
            context.abort(code, "injected failure")
            return True
        return False

    # ---- Admin -----------------------------------------------------------------------------

    def GetPool(self, request, context):  # noqa: N802 -- gRPC method name
        with self._lock:
            ws = [
                pool_pb2.WorkerStatus(
                    worker=i,
                    degree=w.degree,
                    domain=w.domain,
                    offset=w.offset,
                    state=w.state,
                    failure=w.failure,
                )
                for i, w in sorted(self.workers.items())
            ]
            return pool_pb2.PoolStatus(
                epoch=self.epoch, workers=ws, router_id=self.router_id, store="memory"
            )

    def Drain(self, request, context):  # noqa: N802
        if self._fail(context, "drain"):
            return pool_pb2.DrainResponse()
        with self._lock:
            (self.resumes if request.resume else self.drains).append((request.worker, time.time()))
            w = self.workers.get(request.worker)
            if w is not None and not w.failure:
                w.state = (
                    pool_pb2.WorkerStatus.SERVING
                    if request.resume
                    else pool_pb2.WorkerStatus.DRAINING
                )
        if request.resume:
            return pool_pb2.DrainResponse()
        if self.on_drain is not None:
            self.on_drain(request.worker)
        timeout = request.timeout_seconds or 60.0
        if not self._released.wait(timeout):
            return pool_pb2.DrainResponse(drained=False)
        if self.drain_delay_s:
            time.sleep(self.drain_delay_s)
        return pool_pb2.DrainResponse(drained=True)

    def Switch(self, request, context):  # noqa: N802
        if self._fail(context, "switch"):
            return pool_pb2.SwitchResponse()
        if self.on_switch is not None:
            self.on_switch(request)
        self._switch_released.wait(60.0)
        grouping = tuple((s.worker, s.degree, s.domain, s.offset) for s in request.grouping)
        if not grouping or any(s[2] != request.domain for s in grouping):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "grouping: every slot must be in the domain"
            )
        with self._lock:
            # As the router: a worker that leaves must have been drained here (a failed
            # one's drain is not shown: it keeps reading FAILED).
            undrained = [
                w
                for w in request.removed
                if w in self.workers
                and not self.workers[w].failure
                and self.workers[w].state != pool_pb2.WorkerStatus.DRAINING
            ]
            if undrained:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"workers {undrained} are not drained"
                )
            current = tuple(
                sorted(
                    (i, w.degree, w.domain, w.offset)
                    for i, w in self.workers.items()
                    if w.domain == request.domain
                )
            )
            effective = not (request.epoch <= self.epoch and current == tuple(sorted(grouping)))
            if effective:
                for i in [i for i, w in self.workers.items() if w.domain == request.domain]:
                    del self.workers[i]
                for wid, deg, dom, off in grouping:
                    self.workers[wid] = _Worker(deg, dom, off)
                self.epoch = max(self.epoch, request.epoch)
            self.switches.append(
                SwitchCall(
                    request.epoch,
                    request.domain,
                    grouping,
                    tuple(request.removed),
                    request.kind,
                    time.time(),
                    effective,
                )
            )
        if self.switch_delay_s:
            time.sleep(self.switch_delay_s)
        return pool_pb2.SwitchResponse(
            epoch=request.epoch,
            switch_seconds=self.switch_delay_s,
            added=[s[0] for s in grouping if s[0] not in request.removed],
        )

    def Reconfigure(self, request, context):  # noqa: N802
        context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this router does not run transitions itself (the operator does)",
        )

    def Scan(self, request, context):  # noqa: N802
        return pool_pb2.ScanResponse()

    def TakeWindow(self, request, context):  # noqa: N802
        with self._lock:
            self.takes.append((request.hop, time.time()))
            report = self.windows.get(request.hop)
            if report is None:
                d, n, long_n, long_d = self._demand
                report = pool_pb2.WindowReport(
                    hop=request.hop,
                    demand_seconds=d,
                    requests=n,
                    long_requests=long_n,
                    long_demand_seconds=long_d,
                    reconfiguring=any(
                        w.state != pool_pb2.WorkerStatus.SERVING for w in self.workers.values()
                    ),
                    placed=[
                        pool_pb2.PlacedRequest(
                            offset_seconds=o, length=n, cached_tokens=c, block_keys=k
                        )
                        for o, n, c, k in self._placed
                    ],
                    cache_blocks_per_gpu=self.cache_blocks_per_gpu,
                )
                self.windows[request.hop] = report
            return report


def main() -> None:  # pragma: no cover -- a manual aid: python tests/operator/fake_router.py
    import argparse

    p = argparse.ArgumentParser(description="serve the stand-in Admin API on 127.0.0.1")
    p.add_argument("--demand", type=float, default=0.0)
    args = p.parse_args()
    with FakeRouter() as r:
        r.set_demand(args.demand)
        print(r.address, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
