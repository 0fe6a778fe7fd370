"""The SGLang adapter against real stand-in servers (``sglang_standin.py``) and real gRPC.

Every test starts the adapter (:class:`vertumnus.worker.sglang.adapter.SglangEngine`) on a
pod of loopback stand-in servers — separate processes, run with exactly the flags the
command builder emits — and talks to it through the same ``PoolServer`` endpoints as the
torch engine's, as the router does: Describe, Prefill, StreamCacheEvents, ListBlocks,
FlushCache, Drain, Epoch, CopyBlocks, gRPC health. The stand-in publishes its KV events
over ZMQ as SGLang does, so these tests need pyzmq (the ``sglang`` extra) and skip
without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vertumnus._proto import worker_pb2, worker_pb2_grpc
from vertumnus.core.keys import token_block_keys

from .conftest import free_ports

pytest.importorskip(
    "zmq", reason="the SGLang adapter's event subscriber needs pyzmq (sglang extra)"
)

from vertumnus.worker.service import POD_SERVICE, PoolServer  # noqa: E402
from vertumnus.worker.sglang.adapter import AdapterSettings, SglangEngine  # noqa: E402
from vertumnus.worker.sglang.command import PortPlan, SglangOptions  # noqa: E402
from vertumnus.worker.sglang.serve import serve_engine  # noqa: E402
from vertumnus.worker.sglang.server import ServerDown  # noqa: E402

STANDIN = Path(__file__).with_name("sglang_standin.py")
B = 16  # block size = the stand-in's --page-size
KINDS = worker_pb2.CacheEvent


def tokens(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + 31 * i) % 256 for i in range(n)]


class Pod:
    """An adapter over stand-in servers, served on loopback gRPC endpoints."""

    def __init__(self, tmp: Path, degrees: list[int], **settings: object) -> None:
        self.world = sum(degrees)
        base = free_ports(6 * self.world)
        w = self.world
        self.ports = PortPlan(
            http=base,
            bootstrap=base + w,
            events=base + 2 * w,
            replay=base + 3 * w,
            nccl=base + 4 * w,
        )
        (tmp / "config.json").write_text(json.dumps({"vocab_size": 256}))
        options = SglangOptions(model_path=str(tmp), block_size=B, ports=self.ports)
        defaults = {
            "launcher": (sys.executable, str(STANDIN)),
            "health_timeout_s": 20.0,
            "stop_timeout_s": 5.0,
            "max_tokens": 4096,
        }
        defaults.update(settings)
        self.engine = SglangEngine(
            self.world, degrees, options, AdapterSettings(**defaults), log=sys.stderr
        )
        self.server = serve_engine(self.engine, PoolServer(self.world, base_port=base + 5 * w))
        self.channels = [grpc.insecure_channel(self.server.address(r)) for r in range(w)]

    def stub(self, rank: int) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(self.channels[rank])

    def health(self, rank: int, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channels[rank])
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def pod_health(self) -> int:
        """What the kubelet's readiness probe asks (the pod as a whole, at rank 0)."""
        return self.health(0, POD_SERVICE)

    def http(self, offset: int, path: str, body: object = None) -> dict:
        """Call the stand-in at ``offset`` directly (its server info, its fault controls)."""
        data = None if body is None else json.dumps(body).encode()
        url = f"http://127.0.0.1:{self.ports.http + offset}{path}"
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as r:
            return json.loads(r.read())

    def prefill(self, rank: int, ids: list[int], rid: str = "r") -> worker_pb2.PrefillResponse:
        return self.stub(rank).Prefill(
            worker_pb2.PrefillRequest(request_id=rid, token_ids=ids), timeout=10
        )

    def drain(self, rank: int) -> None:
        self.stub(rank).Drain(worker_pb2.DrainRequest(), timeout=10)

    def epoch(self, epoch: int, *slots: tuple[int, int, int]) -> worker_pb2.EpochResponse:
        grouping = [worker_pb2.WorkerSlot(worker=i, degree=d, offset=o) for i, d, o in slots]
        return self.stub(0).Epoch(
            worker_pb2.EpochRequest(epoch=epoch, grouping=grouping), timeout=30
        )

    def events(self, rank: int, until, from_sequence: int = 0, timeout: float = 10.0) -> list:
        """Events of the worker at ``rank`` until ``until(events)`` holds."""
        call = self.stub(rank).StreamCacheEvents(
            worker_pb2.StreamCacheEventsRequest(from_sequence=from_sequence), timeout=timeout
        )
        out: list = []
        try:
            for e in call:
                out.append(e)
                if until(out):
                    break
        finally:
            call.cancel()
        return out

    def close(self) -> None:
        for c in self.channels:
            c.close()
        self.server.stop(0)
        self.engine.close()


@pytest.fixture
def pod(tmp_path):
    pods: list[Pod] = []

    def make(degrees: list[int], **settings: object) -> Pod:
        p = Pod(tmp_path, degrees, **settings)
        pods.append(p)
        return p

    yield make
    for p in pods:
        p.close()


@contextlib.asynccontextmanager
async def router_over(p: Pod):  # type: ignore[no-untyped-def]
    """A real router (in this process, on loopback) over the pod's adapter."""
    from vertumnus.router.serve import start_router
    from vertumnus.router.settings import RouterSettings

    settings = RouterSettings(
        listen=f"127.0.0.1:{free_ports(1)}", metrics_listen="", cache_manager=None
    )
    running = await start_router(settings, [p.server.address(0)])
    try:
        yield running
    finally:
        await running.stop()


def stored_keys(events) -> list[int]:
    return [k for e in events if e.kind == KINDS.STORED for k in e.block_keys]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


# -- start, prefill, events, snapshots -----------------------------------------------------


def test_a_pod_serves_prefills_events_and_snapshots_in_our_keys(pod):
    p = pod([2, 1, 1])
    d = p.stub(0).Describe(worker_pb2.DescribeRequest(), timeout=5)
    assert (d.worker, d.degree, d.offset, d.epoch, d.world) == (0, 2, 0, 1, 4)
    assert (d.block_size, d.vocab_size, d.max_tokens, d.draining) == (B, 256, 4096, False)
    # Rank 1 is the second GPU of worker 0: it serves nothing and says where to go.
    with pytest.raises(grpc.RpcError) as e:
        p.stub(1).Describe(worker_pb2.DescribeRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "worker 0 (CP2, GPUs 0-1)" in e.value.details()
    serving = health_pb2.HealthCheckResponse.SERVING
    assert [p.health(r) == serving for r in range(4)] == [True, False, True, True]

    # Cached tokens grow on a repeated prefix: whole pages, the last token always computed.
    a = tokens(100, seed=1)
    assert [p.prefill(0, a).cached_tokens for _ in range(2)] == [0, 96]
    longer = a + tokens(60, seed=2)
    out = p.prefill(0, longer)
    assert (out.cached_tokens, out.degree, out.epoch) == (96, 2, 1)
    assert out.execution_seconds > 0
    info = p.http(0, "/get_server_info")
    assert (info["tp_size"], info["attn_cp_size"], info["page_size"]) == (2, 2, B)
    # The prefill server gets SGLang's fake decode peer (no KV transfer).
    assert {"bootstrap_host", "bootstrap_room", "input_ids"} <= set(
        info["standin"]["last_generate_keys"]
    )

    # The server's pages arrive as our events, keyed as the router keys a request.
    keys = list(token_block_keys(longer, B))
    events = p.events(0, lambda es: len(stored_keys(es)) >= len(keys))
    assert stored_keys(events) == keys
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))  # ours start at 1
    assert {e.incarnation for e in events} == {d.incarnation}
    assert [k for e in events for k in e.parent_keys][1:] == keys[:-1]

    listing = p.stub(0).ListBlocks(worker_pb2.ListBlocksRequest(), timeout=5)
    assert [b.key for b in listing.served] == keys
    assert listing.sequence == events[-1].sequence and listing.worker == 0

    # The other workers have their own caches and streams.
    assert p.prefill(2, a).cached_tokens == 0

    with pytest.raises(grpc.RpcError) as e:
        p.prefill(0, [1, 2, 300])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token id 300 outside the vocabulary [0, 256)" in e.value.details()

    # FlushCache: the server's cache is empty, one CLEARED (or SGLang's own after it).
    flushed = p.stub(0).FlushCache(worker_pb2.FlushCacheRequest(), timeout=10)
    assert flushed.removed_blocks == len(keys)
    after = p.events(0, lambda es: es[-1].kind == KINDS.CLEARED, from_sequence=listing.sequence)
    assert after[0].kind == KINDS.CLEARED and after[0].sequence == listing.sequence + 1
    assert p.prefill(0, a).cached_tokens == 0


def test_copy_and_evict_are_refused_naming_why(pod):
    p = pod([1, 1])
    with pytest.raises(grpc.RpcError) as e:
        p.stub(1).CopyBlocks(
            worker_pb2.CopyBlocksRequest(source_worker=0, block_keys=[1, 2]), timeout=5
        )
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no API to copy KV blocks" in e.value.details() and "recomputed" in e.value.details()
    assert p.engine.copies_refused == 1
    with pytest.raises(grpc.RpcError) as e:
        p.stub(0).EvictBlocks(worker_pb2.EvictBlocksRequest(block_keys=[1]), timeout=5)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no API to drop chosen blocks" in e.value.details()


# -- drain and regrouping -----------------------------------------------------------------


def test_drain_then_split_and_merge_restart_only_the_affected_servers(pod):
    p = pod([2, 2])
    kept_pid = p.http(2, "/get_server_info")["standin"]["pid"]
    old_stream = p.stub(0).StreamCacheEvents(worker_pb2.StreamCacheEventsRequest(), timeout=30)

    # Drain waits for the prefill in flight, then refuses new ones (retryable).
    p.http(0, "/standin/control", {"delay": 0.5})
    done: list = []
    runner = threading.Thread(target=lambda: done.append(p.prefill(0, tokens(40, 3))))
    runner.start()
    wait_for(lambda: p.http(0, "/get_server_info")["standin"]["last_generate_keys"])
    started = time.monotonic()
    p.drain(0)
    assert time.monotonic() - started > 0.2  # it waited for the prefill in flight ...
    runner.join()
    assert done and done[0].cached_tokens == 0  # ... which was answered, not refused
    with pytest.raises(grpc.RpcError) as e:
        p.prefill(0, tokens(40, 3))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "worker 0 (CP2, GPUs 0-1) is draining; not admitting" in e.value.details()
    assert p.health(0) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert p.pod_health() == health_pb2.HealthCheckResponse.SERVING  # the pod is not lost

    # Split worker 0 (CP2) into workers 10 and 11 (CP1); worker 2 is kept.
    split = p.epoch(2, (10, 1, 0), (11, 1, 1), (2, 2, 2))
    assert split.epoch == 2 and not split.unchanged and split.switch_seconds > 0
    for rank, worker in ((0, 10), (1, 11)):
        d = p.stub(rank).Describe(worker_pb2.DescribeRequest(), timeout=5)
        assert (d.worker, d.degree, d.epoch, d.draining) == (worker, 1, 2, False)
        info = p.http(rank, "/get_server_info")
        assert (info["tp_size"], info["attn_cp_size"]) == (1, 1)
        assert info["standin"]["cuda_visible_devices"] == str(rank)
    assert p.http(2, "/get_server_info")["standin"]["pid"] == kept_pid
    assert p.stub(2).Describe(worker_pb2.DescribeRequest(), timeout=5).epoch == 2
    assert p.prefill(2, tokens(40, 4)).epoch == 2  # kept serving
    with pytest.raises(grpc.RpcError) as e:  # the old worker's stream ended
        list(old_stream)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "left the grouping in epoch 2" in e.value.details()
    # The same epoch and grouping again: nothing happens (a controller resuming).
    assert p.epoch(2, (10, 1, 0), (11, 1, 1), (2, 2, 2)).unchanged
    assert p.http(2, "/get_server_info")["standin"]["pid"] == kept_pid

    # Merge back: refused until both halves are drained.
    merge = ((12, 2, 0), (2, 2, 2))
    with pytest.raises(grpc.RpcError) as e:
        p.epoch(3, *merge)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "must be drained before epoch 3" in e.value.details()
    p.drain(0)
    p.drain(1)
    # While the servers restart, the pod stays ready: a regroup is not a lost domain.
    merged: list = []
    switching = threading.Thread(target=lambda: merged.append(p.epoch(3, *merge)))
    switching.start()
    during = []
    while switching.is_alive():
        during.append(p.pod_health())
    switching.join()
    assert during and set(during) == {health_pb2.HealthCheckResponse.SERVING}
    assert merged[0].epoch == 3
    info = p.http(0, "/get_server_info")
    assert (info["tp_size"], info["attn_cp_size"]) == (2, 2)
    assert info["standin"]["cuda_visible_devices"] == "0,1"
    assert p.http(2, "/get_server_info")["standin"]["pid"] == kept_pid
    # Nothing survives a restart; the new worker's events start at 1.
    ids = tokens(40, 3)
    assert p.prefill(0, ids).cached_tokens == 0
    events = p.events(0, lambda es: len(stored_keys(es)) >= 2)
    assert events[0].sequence == 1 and stored_keys(events) == list(token_block_keys(ids, B))
    assert [r.epoch for r in p.engine.restarts] == [1, 2, 3]
    assert set(p.engine.restarts[2].stopped) == {10, 11} and set(p.engine.restarts[2].started) == {
        12
    }


def test_a_server_that_ignores_sigterm_is_killed(pod, monkeypatch):
    p = pod([1], stop_timeout_s=0.3)
    pid = p.engine.worker(0).server.pid
    monkeypatch.setenv("STANDIN_IGNORE_SIGTERM", "1")  # for the next server: read at its start
    p.drain(0)
    p.epoch(2, (1, 1, 0))
    monkeypatch.delenv("STANDIN_IGNORE_SIGTERM")
    assert not alive(pid)
    p.drain(0)
    stubborn = p.engine.worker(1).server.pid
    p.epoch(3, (2, 1, 0))
    assert p.engine.restarts[-1].stopped[1] >= 0.3 and not alive(stubborn)


# -- failures ------------------------------------------------------------------------------


def test_a_crashed_server_is_reported_with_its_exit_and_output_not_restarted(pod):
    p = pod([1, 1])
    p.prefill(1, tokens(40, 5))
    pid = p.engine.worker(1).server.pid
    with contextlib.suppress(OSError):  # it may die before the answer is read
        p.http(1, "/standin/control", {"crash": 7})
    wait_for(lambda: p.health(1) == health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(grpc.RpcError) as e:
        p.prefill(1, tokens(40, 5))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = e.value.details()
    assert "worker 1 (CP1, GPU 1) is failed" in message and "exited with code 7" in message
    assert "stand-in crash on demand" in message  # the tail of its output
    described = p.stub(1).Describe(worker_pb2.DescribeRequest(), timeout=5)
    assert described.draining and "exited with code 7" in described.failure
    assert "exited with code 7" in p.engine.worker(1).failure
    assert p.stub(0).Describe(worker_pb2.DescribeRequest(), timeout=5).failure == ""
    # Its stream says the cache is gone, then ends naming why (so a router learns of
    # the failure without sending a request); nothing restarted it.
    events: list = []
    with pytest.raises(grpc.RpcError) as ended:
        for e in p.stub(1).StreamCacheEvents(worker_pb2.StreamCacheEventsRequest(), timeout=10):
            events.append(e)
    assert events and events[-1].kind == KINDS.CLEARED
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "worker 1 (CP1, GPU 1) is failed" in ended.value.details()
    assert "exited with code 7" in ended.value.details()
    assert not alive(pid) and p.engine.worker(1).server.pid == pid
    # The other worker is untouched, and the pod stays ready (the kubelet must not
    # take the whole domain out for one worker).
    assert p.health(0) == health_pb2.HealthCheckResponse.SERVING
    assert p.pod_health() == health_pb2.HealthCheckResponse.SERVING
    assert p.prefill(0, tokens(40, 6)).cached_tokens == 0
    # An epoch that replaces the failed worker (no drain needed) starts a new server.
    p.epoch(2, (0, 1, 0), (5, 1, 1))
    assert p.health(1) == health_pb2.HealthCheckResponse.SERVING
    assert p.prefill(1, tokens(40, 5)).cached_tokens == 0
    assert p.stub(1).Describe(worker_pb2.DescribeRequest(), timeout=5).failure == ""


def test_the_router_takes_a_worker_whose_server_failed_out_of_placement(pod):
    """A real router over the adapter: once a server exits, the first request that
    meets its worker (FAILED_PRECONDITION) makes the router ask Describe, read the
    failure and stop placing there; every request is answered by the other worker."""
    import asyncio

    from vertumnus._proto import pool_pb2, pool_pb2_grpc

    p = pod([1, 1])

    async def scenario():  # type: ignore[no-untyped-def]
        async with router_over(p) as running:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)

                async def send(i: int):  # type: ignore[no-untyped-def]
                    return await stub.Prefill(
                        pool_pb2.PrefillRequest(request_id=f"r{i}", token_ids=tokens(40, i)),
                        timeout=30,
                    )

                # Concurrent, so that placement uses both workers.
                before = await asyncio.gather(*(send(i) for i in range(6)))
                with contextlib.suppress(OSError):
                    p.http(1, "/standin/control", {"crash": 7})
                await asyncio.to_thread(
                    wait_for, lambda: p.health(1) == health_pb2.HealthCheckResponse.NOT_SERVING
                )
                after = await asyncio.gather(*(send(100 + i) for i in range(12)))
                await asyncio.sleep(0.5)  # a few probe intervals: it must stay out
                later = await asyncio.gather(*(send(200 + i) for i in range(12)))
            w1 = running.router.workers[1]
            return before, after, later, w1.unreachable, w1.failure

    before, after, later, unreachable, failure = asyncio.run(scenario())
    assert {r.worker for r in before} == {0, 1}  # both served before the crash
    # The burst that meets the failure: what was already forwarded to worker 1 pays a
    # second attempt, and everything is answered by worker 0.
    assert all(r.worker == 0 for r in after)
    # Afterwards the worker stays out (its Describe reports the failure): no request
    # tries it again. Before, a failed worker was re-admitted by the probe and about
    # half of every burst paid a failed attempt there.
    assert all(r.worker == 0 and r.attempts == 1 for r in later)
    assert unreachable and "exited with code 7" in failure


def test_a_router_reports_a_failed_worker_unasked_and_a_replace_switch_swaps_it(pod):
    """No request meets the failure: the worker's event stream ending tells the router,
    which reports it FAILED with the reason in GetPool (what the operator polls). Then
    the operator's replacement, through the router's Admin API: Drain, and Switch of
    kind ``replace`` to a new worker id at the same GPU, whose new server serves."""
    import asyncio

    from vertumnus._proto import pool_pb2, pool_pb2_grpc

    p = pod([1, 1])

    async def scenario():  # type: ignore[no-untyped-def]
        async with router_over(p) as running:
            async with grpc.aio.insecure_channel(running.address) as ch:
                admin = pool_pb2_grpc.AdminStub(ch)
                prefill = pool_pb2_grpc.PrefillStub(ch)
                with contextlib.suppress(OSError):
                    p.http(1, "/standin/control", {"crash": 7})
                deadline = time.monotonic() + 15
                while True:
                    pool = await admin.GetPool(pool_pb2.GetPoolRequest(), timeout=5)
                    state = {w.worker: w for w in pool.workers}
                    if state[1].state == pool_pb2.WorkerStatus.FAILED:
                        break
                    assert time.monotonic() < deadline, "the router never reported the failure"
                    await asyncio.sleep(0.05)
                failed = state[1]
                kept = state[0].state
                drained = await admin.Drain(
                    pool_pb2.DrainRequest(worker=1, timeout_seconds=10), timeout=15
                )
                grouping = [
                    pool_pb2.Slot(worker=0, degree=1, domain=0, offset=0),
                    pool_pb2.Slot(worker=2, degree=1, domain=0, offset=1),
                ]
                switched = await admin.Switch(
                    pool_pb2.SwitchRequest(
                        epoch=2, domain=0, grouping=grouping, removed=[1], kind="replace"
                    ),
                    timeout=30,
                )
                after = await admin.GetPool(pool_pb2.GetPoolRequest(), timeout=5)
                answers = await asyncio.gather(
                    *(
                        prefill.Prefill(
                            pool_pb2.PrefillRequest(request_id=f"r{i}", token_ids=tokens(40, i)),
                            timeout=30,
                        )
                        for i in range(8)
                    )
                )
            return failed, kept, drained, switched, after, answers

    failed, kept, drained, switched, after, answers = asyncio.run(scenario())
    assert "exited with code 7" in failed.failure and kept == pool_pb2.WorkerStatus.SERVING
    assert drained.drained and list(switched.added) == [2]
    states = {w.worker: (w.state, w.offset, w.failure) for w in after.workers}
    assert states == {
        0: (pool_pb2.WorkerStatus.SERVING, 0, ""),
        2: (pool_pb2.WorkerStatus.SERVING, 1, ""),
    }
    assert after.epoch == 2
    assert {r.worker for r in answers} == {0, 2}  # the new server takes requests


def test_a_server_that_does_not_start_is_named_with_its_exit_code(tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_EXIT_AT_START", "4")
    with pytest.raises(ServerDown) as e:
        Pod(tmp_path, [1, 1])
    message = str(e.value)
    assert "worker 0 (CP1, GPU 0)" in message and "worker 1 (CP1, GPU 1)" in message
    assert "exited with code 4" in message and "failing at start as asked" in message


# -- event gaps --------------------------------------------------------------------------


def test_sequence_gaps_are_filled_by_the_replay(pod):
    p = pod([1])
    # Batch 1 never arrives live: batch 2 shows the gap, the replay fills it. Batch 3, the
    # last, never arrives either and nothing comes after it: the quiet stream's catch-up
    # replay brings it.
    p.http(0, "/standin/control", {"drop": [1, 3]})
    prompts = [tokens(32, seed) for seed in (7, 8, 9, 10)]
    for ids in prompts:
        p.prefill(0, ids)
    want = [k for ids in prompts for k in token_block_keys(ids, B)]
    events = p.events(0, lambda es: len(stored_keys(es)) >= len(want))
    assert stored_keys(events) == want
    assert [e.sequence for e in events] == [1, 2, 3, 4]
    assert p.engine.worker(0).pump.recoveries == 0


def test_a_gap_the_replay_cannot_fill_flushes_the_server_and_clears(pod):
    p = pod([1])
    p.http(0, "/standin/control", {"forget": [1]})  # gone from the replay buffer too
    a, b, c = (tokens(32, seed) for seed in (7, 8, 9))
    for ids in (a, b, c):
        p.prefill(0, ids)
    events = p.events(0, lambda es: any(e.kind == KINDS.CLEARED for e in es))
    # b's batch is lost for good; c's still applies (its pages chain from the root).
    assert stored_keys(events) == [*token_block_keys(a, B), *token_block_keys(c, B)]
    assert events[-1].kind == KINDS.CLEARED
    wait_for(lambda: p.engine.worker(0).pump.recoveries == 1)
    # The server's cache was flushed, so CLEARED is the truth and the router is in sync.
    listing = p.stub(0).ListBlocks(worker_pb2.ListBlocksRequest(), timeout=5)
    assert list(listing.served) == []
    assert p.prefill(0, a).cached_tokens == 0
    more = p.events(0, lambda es: len(stored_keys(es)) >= 2, from_sequence=listing.sequence)
    assert stored_keys(more) == list(token_block_keys(a, B))


# -- the command ---------------------------------------------------------------------------


def test_vertumnus_worker_runs_the_adapter_until_sigterm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 256}))
    base = free_ports(12)
    argv = [
        sys.executable, "-m", "vertumnus", "worker", "--engine", "sglang", "--degrees", "1,1",
        "--model", str(tmp_path), "--launcher", f"{sys.executable} {STANDIN}",
        "--grpc-base-port", str(base), "--http-base-port", str(base + 2),
        "--bootstrap-base-port", str(base + 4), "--events-base-port", str(base + 6),
        "--replay-base-port", str(base + 8), "--nccl-base-port", str(base + 10),
        "--worker-ids", "4,5", "--health-timeout", "20",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("serving 2 GPUs"):
                break
        assert any(x.startswith("worker 5 (CP1, GPU 1) at 127.0.0.1:") for x in lines), lines
        with grpc.insecure_channel(f"127.0.0.1:{base + 1}") as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            assert stub.Describe(worker_pb2.DescribeRequest(), timeout=5).worker == 5
            out = stub.Prefill(worker_pb2.PrefillRequest(token_ids=tokens(20, 1)), timeout=10)
            assert out.degree == 1
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=20) == 0, rest
        assert "vertumnus: stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_repair_benchmark_runs_one_round(tmp_path):
    """bench/sglang_repair.py end to end (one round): its figures are there and sane."""
    out = tmp_path / "repair.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / "sglang_repair.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--rounds", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rounds"]
    assert set(row) == {"detect_s", "replace_s", "first_answer_s"}
    assert all(0 < v < 60 for v in row.values()), row
