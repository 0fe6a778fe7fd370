"""The gRPC worker service on loopback: a real server per rank, a real client.

The engine's one worker has the pool-level id 7 (not its first rank, 0), so
every check below tells ids and ranks apart.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vertumnus._proto import worker_pb2, worker_pb2_grpc
from vertumnus.core.lattice import Slot
from vertumnus.worker.blocks import block_keys
from vertumnus.worker.engine import Engine
from vertumnus.worker.rank import RankSpec
from vertumnus.worker.service import SERVICE_NAME, PoolServer

from .conftest import random_tokens

BLOCK = 8
STORED, REMOVED, CLEARED, RESYNC = (
    worker_pb2.CacheEvent.STORED,
    worker_pb2.CacheEvent.REMOVED,
    worker_pb2.CacheEvent.CLEARED,
    worker_pb2.CacheEvent.RESYNC,
)


@pytest.fixture(scope="module")
def served():
    spec = RankSpec(dtype="float32", block_size=BLOCK, num_blocks=64, seed=7)
    with Engine(2, [Slot(7, 2, 0, 0)], spec, max_tokens=256) as engine:
        server = PoolServer(2).start(engine)
        channels = [grpc.insecure_channel(server.address(r)) for r in range(2)]
        yield engine, server, channels
        for c in channels:
            c.close()
        server.stop()


def _stub(channels, rank):
    return worker_pb2_grpc.WorkerStub(channels[rank])


def _health(channels, rank):
    req = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    return health_pb2_grpc.HealthStub(channels[rank]).Check(req, timeout=5).status


class Reader:
    """Reads a StreamCacheEvents stream on a thread, so the test can act meanwhile."""

    def __init__(self, stub, **request):
        self.call = stub.StreamCacheEvents(
            worker_pb2.StreamCacheEventsRequest(**request), timeout=60
        )
        self.events: list = []
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            for e in self.call:
                self.events.append(e)
        except grpc.RpcError as exc:
            self.error = exc

    def wait_for(self, n: int, timeout: float = 30) -> list:
        deadline = time.monotonic() + timeout
        while len(self.events) < n and time.monotonic() < deadline and self.error is None:
            time.sleep(0.02)
        assert len(self.events) >= n, (self.events, self.error)
        return self.events[:n]

    def ended(self, timeout: float = 30) -> grpc.RpcError | None:
        self._thread.join(timeout)
        return self.error

    def cancel(self):
        self.call.cancel()
        self._thread.join(10)


def test_prefill_reports_first_token_times_and_reuse(served):
    engine, _, channels = served
    stub = _stub(channels, 0)
    tokens = random_tokens(40, seed=1)
    first = stub.Prefill(worker_pb2.PrefillRequest(request_id="a", token_ids=tokens), timeout=60)
    assert first.request_id == "a" and first.cached_tokens == 0 and first.degree == 2
    assert first.execution_seconds > 0 and first.queue_seconds >= 0
    second = stub.Prefill(
        worker_pb2.PrefillRequest(request_id="b", token_ids=tokens + [5]), timeout=60
    )
    assert second.cached_tokens == 40
    assert _health(channels, 0) == health_pb2.HealthCheckResponse.SERVING
    assert (
        _health(channels, 1) == health_pb2.HealthCheckResponse.NOT_SERVING
    )  # rank 1 leads no worker


def test_describe_names_the_worker_by_its_pool_level_id(served):
    engine, _, channels = served
    d = _stub(channels, 0).Describe(worker_pb2.DescribeRequest(), timeout=10)
    assert (d.worker, d.degree, d.offset, d.epoch, d.draining) == (7, 2, 0, engine.epoch, False)
    assert (d.block_size, d.max_tokens, d.vocab_size, d.world) == (BLOCK, 256, engine.vocab_size, 2)
    assert d.incarnation == engine.incarnation != 0


def test_a_rank_that_leads_no_worker_says_which_endpoint_to_use(served):
    _, server, channels = served
    for call, request in (
        ("Prefill", worker_pb2.PrefillRequest(request_id="x", token_ids=[1])),
        ("Describe", worker_pb2.DescribeRequest()),
    ):
        with pytest.raises(grpc.RpcError) as err:
            getattr(_stub(channels, 1), call)(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == (
            "rank 1 is not the first rank of a worker in epoch 1: it is rank 1 of worker 7 (CP2, ranks 0-1); "
            f"send worker 7's calls to the endpoint of rank 0, 127.0.0.1:{server.ports[0]}"
        )


@pytest.mark.parametrize(
    ("tokens", "code", "text"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "token_ids is empty"),
        (
            [1] * 257,
            grpc.StatusCode.INVALID_ARGUMENT,
            "257 tokens exceed the engine maximum of 256",
        ),
        ([1, -4], grpc.StatusCode.INVALID_ARGUMENT, "token id -4 outside the vocabulary"),
    ],
    ids=["empty", "too-long", "bad-token"],
)
def test_bad_prefills_get_clear_errors_and_serving_continues(served, tokens, code, text):
    _, _, channels = served
    stub = _stub(channels, 0)
    with pytest.raises(grpc.RpcError) as err:
        stub.Prefill(worker_pb2.PrefillRequest(request_id="bad", token_ids=tokens), timeout=60)
    assert err.value.code() == code and text in err.value.details()
    ok = stub.Prefill(worker_pb2.PrefillRequest(request_id="ok", token_ids=[3, 4, 5]), timeout=60)
    assert ok.first_token_id >= 0


def test_copy_from_a_worker_that_does_not_exist_is_a_failed_precondition(served):
    _, _, channels = served
    with pytest.raises(grpc.RpcError) as err:
        _stub(channels, 0).CopyBlocks(
            worker_pb2.CopyBlocksRequest(source_worker=0, block_keys=[1, 2]), timeout=60
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no worker 0 in epoch 1; workers: [7: CP2 at rank 0]" in err.value.details()


def test_cache_events_replay_resync_flush_and_snapshot_over_grpc(served):
    engine, _, channels = served
    stub = _stub(channels, 0)
    stub.FlushCache(worker_pb2.FlushCacheRequest(), timeout=60)
    start = stub.ListBlocks(worker_pb2.ListBlocksRequest(), timeout=10)
    assert (start.worker, start.incarnation, list(start.served)) == (7, engine.incarnation, [])
    live = Reader(stub, from_sequence=start.sequence)
    tokens = random_tokens(24, seed=2)
    keys = block_keys(tokens, BLOCK)
    stub.Prefill(worker_pb2.PrefillRequest(request_id="ev", token_ids=tokens), timeout=60)
    s = start.sequence
    got = live.wait_for(2)
    assert [(e.kind, e.sequence, e.rank, e.worker, e.incarnation) for e in got] == [
        (STORED, s + 1, 0, 7, engine.incarnation),
        (STORED, s + 2, 1, 7, engine.incarnation),
    ]
    assert (list(got[0].block_keys), list(got[0].positions), got[0].parent_keys[1]) == (
        [keys[0], keys[2]],
        [0, 2],
        keys[1],
    )
    assert (list(got[1].block_keys), list(got[1].parent_keys)) == ([keys[1]], [keys[0]])

    snapshot = stub.ListBlocks(worker_pb2.ListBlocksRequest(), timeout=10)
    assert snapshot.sequence == s + 2
    assert [(b.key, b.position, b.parent) for b in snapshot.served] == [
        (keys[0], 0, 0),
        (keys[1], 1, keys[0]),
        (keys[2], 2, keys[1]),
    ]
    by_rank = {r.rank: r for r in snapshot.ranks}
    assert list(by_rank[1].block_keys) == [keys[1]] and list(by_rank[1].parent_keys) == [keys[0]]

    assert stub.FlushCache(worker_pb2.FlushCacheRequest(), timeout=60).removed_blocks == 3
    (cleared,) = live.wait_for(3)[2:]
    assert (cleared.kind, cleared.sequence, list(cleared.block_keys)) == (CLEARED, s + 3, [])
    live.cancel()

    replay = Reader(
        stub, from_sequence=s + 1, incarnation=engine.incarnation
    )  # reconnect after s + 1
    assert [e.sequence for e in replay.wait_for(2)] == [s + 2, s + 3]
    replay.cancel()
    ahead = Reader(stub, from_sequence=s + 100)  # not this worker's history
    (resync,) = ahead.wait_for(1)
    assert (resync.kind, resync.sequence, resync.worker) == (RESYNC, s + 3, 7)
    ahead.cancel()


def test_epoch_over_grpc_regroups_with_pool_level_ids(served):
    engine, server, channels = served
    stub = _stub(channels, 0)
    tokens = random_tokens(16, seed=3)
    keys = block_keys(tokens, BLOCK)
    stub.Prefill(worker_pb2.PrefillRequest(request_id="ev", token_ids=tokens), timeout=60)
    epoch = engine.epoch
    old_stream = Reader(stub, from_sequence=engine.list_blocks(7).sequence)

    def slots(*triples):
        return [worker_pb2.WorkerSlot(worker=w, degree=d, offset=o) for w, d, o in triples]

    split = slots((8, 1, 0), (9, 1, 1))
    with pytest.raises(grpc.RpcError) as err:  # the worker still admits
        stub.Epoch(worker_pb2.EpochRequest(epoch=epoch + 1, grouping=split), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "worker 7 (CP2, ranks 0-1) must be drained" in err.value.details()
    for bad, text in (
        (slots((8, 1, 0)), "grouping: ranks [1] are in no worker"),
        (slots((8, 1, 0), (8, 1, 1)), "grouping: worker ids repeat in the grouping: [8, 8]"),
        (slots((8, 2, 1)), "grouping: worker 8: ranks 1..2 are outside a 2-GPU domain"),
        ([], "grouping: empty"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Epoch(worker_pb2.EpochRequest(epoch=epoch + 1, grouping=bad), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in err.value.details()

    stub.Drain(worker_pb2.DrainRequest(), timeout=60)
    assert _health(channels, 0) == health_pb2.HealthCheckResponse.NOT_SERVING
    reply = stub.Epoch(worker_pb2.EpochRequest(epoch=epoch + 1, grouping=split), timeout=60)
    assert reply.epoch == epoch + 1 and not reply.unchanged and reply.switch_seconds < 5
    error = old_stream.ended()
    assert error is not None and error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"worker 7 (CP2, ranks 0-1) left the grouping in epoch {epoch + 1}" in error.details()

    # the same commit again (a controller resuming): success, nothing changes
    again = _stub(channels, 1).Epoch(
        worker_pb2.EpochRequest(epoch=epoch + 1, grouping=split[::-1]), timeout=60
    )
    assert again.unchanged and again.switch_seconds == 0
    for request, text in (
        (
            worker_pb2.EpochRequest(epoch=epoch, grouping=split),
            f"epoch {epoch} is older than the current epoch",
        ),
        (
            worker_pb2.EpochRequest(epoch=epoch + 1, grouping=slots((7, 2, 0))),
            f"epoch {epoch + 1} is already in force with grouping [8: CP1 at rank 0, 9: CP1 at rank 1]; "
            "grouping [7: CP2 at rank 0] needs a newer epoch",
        ),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Epoch(request, timeout=60)
        assert (
            err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and text in err.value.details()
        )

    assert _health(channels, 0) == _health(channels, 1) == health_pb2.HealthCheckResponse.SERVING
    d = _stub(channels, 1).Describe(worker_pb2.DescribeRequest(), timeout=10)
    assert (d.worker, d.degree, d.offset, d.epoch) == (9, 1, 1, epoch + 1)
    listing = _stub(channels, 1).ListBlocks(worker_pb2.ListBlocksRequest(), timeout=10)
    (held,) = listing.ranks
    assert held.rank == 1 and list(held.block_keys) == [
        keys[1]
    ]  # position 0 was rank 0's under CP2
    assert [b.key for b in listing.served] == [
        keys[1]
    ] and listing.sequence == 1  # a new worker: from 1
    # worker 9 holds half of the prefix; copy the rest from worker 8
    copy = _stub(channels, 1).CopyBlocks(
        worker_pb2.CopyBlocksRequest(source_worker=8, block_keys=keys), timeout=60
    )
    assert (copy.copied_blocks, copy.skipped_blocks) == (1, 1)
    out = _stub(channels, 1).Prefill(
        worker_pb2.PrefillRequest(request_id="r1", token_ids=tokens + [9]), timeout=60
    )
    assert out.cached_tokens == 16 and out.degree == 1
    absent = block_keys(random_tokens(16, seed=4), BLOCK)
    with pytest.raises(grpc.RpcError) as err:
        _stub(channels, 1).CopyBlocks(
            worker_pb2.CopyBlocksRequest(source_worker=8, block_keys=absent), timeout=60
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "source worker 8 lacks 2 of the 2 requested blocks" in err.value.details()
    again = stub.Prefill(worker_pb2.PrefillRequest(request_id="r0", token_ids=tokens), timeout=60)
    assert (
        again.degree == 1 and again.cached_tokens == 8
    )  # rank 0 owns every block of a CP1 worker; it held block 0
