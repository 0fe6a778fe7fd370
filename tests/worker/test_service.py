"""The gRPC worker service on loopback: a real server per rank, a real client."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from vertumnus.worker._proto import worker_pb2, worker_pb2_grpc
from vertumnus.worker.blocks import block_keys
from vertumnus.worker.engine import Engine
from vertumnus.worker.rank import RankSpec
from vertumnus.worker.service import SERVICE_NAME, PoolServer

from .conftest import random_tokens

BLOCK = 8


@pytest.fixture(scope="module")
def served():
    spec = RankSpec(dtype="float32", block_size=BLOCK, num_blocks=64, seed=7)
    with Engine(2, [2], spec, max_tokens=256) as engine:
        server = PoolServer(engine)
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


def test_prefill_reports_first_token_times_and_reuse(served):
    engine, _, channels = served
    stub = _stub(channels, 0)
    tokens = random_tokens(40, seed=1)
    first = stub.Prefill(worker_pb2.PrefillRequest(request_id="a", token_ids=tokens), timeout=60)
    assert first.request_id == "a" and first.cached_tokens == 0 and first.degree == 2
    assert first.execution_seconds > 0 and first.queue_seconds >= 0
    second = stub.Prefill(worker_pb2.PrefillRequest(request_id="b", token_ids=tokens + [5]), timeout=60)
    assert second.cached_tokens == 40
    assert _health(channels, 0) == health_pb2.HealthCheckResponse.SERVING
    assert _health(channels, 1) == health_pb2.HealthCheckResponse.NOT_SERVING  # rank 1 leads no worker


@pytest.mark.parametrize(
    ("tokens", "code", "text"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "token_ids is empty"),
        ([1] * 257, grpc.StatusCode.INVALID_ARGUMENT, "257 tokens exceed the engine maximum of 256"),
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


def test_copy_of_blocks_the_source_lacks_is_a_failed_precondition(served):
    _, _, channels = served
    with pytest.raises(grpc.RpcError) as err:
        _stub(channels, 0).CopyBlocks(
            worker_pb2.CopyBlocksRequest(source_worker=1, block_keys=[1, 2]), timeout=60
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no worker starts at rank 1" in err.value.details()


def test_cache_event_stream_and_regroup_over_grpc(served):
    engine, _, channels = served
    stub = _stub(channels, 0)
    stream = stub.StreamCacheEvents(worker_pb2.StreamCacheEventsRequest(), timeout=60)
    received = []

    def read():
        for event in stream:
            received.append(event)
            if len(received) == 2:
                return

    reader = threading.Thread(target=read)
    reader.start()
    tokens = random_tokens(16, seed=2)
    import time

    time.sleep(0.5)  # let the subscription register before the blocks are stored
    stub.Prefill(worker_pb2.PrefillRequest(request_id="ev", token_ids=tokens), timeout=60)
    reader.join(timeout=30)
    stream.cancel()
    keys = block_keys(tokens, BLOCK)
    assert sorted((e.rank, tuple(e.block_keys)) for e in received) == [(0, (keys[0],)), (1, (keys[1],))]
    assert all(e.kind == worker_pb2.CacheEvent.STORED and e.worker == 0 for e in received)

    # Epoch while the worker still admits: refused; after Drain: CP2 -> 2 x CP1.
    with pytest.raises(grpc.RpcError) as err:
        stub.Epoch(worker_pb2.EpochRequest(epoch=engine.epoch + 1, degrees=[1, 1]), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        stub.Epoch(worker_pb2.EpochRequest(epoch=engine.epoch + 1, degrees=[3]), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub.Drain(worker_pb2.DrainRequest(), timeout=60)
    assert _health(channels, 0) == health_pb2.HealthCheckResponse.NOT_SERVING
    reply = stub.Epoch(worker_pb2.EpochRequest(epoch=engine.epoch + 1, degrees=[1, 1]), timeout=60)
    assert reply.switch_seconds < 5
    assert _health(channels, 1) == health_pb2.HealthCheckResponse.SERVING
    listing = _stub(channels, 1).ListBlocks(worker_pb2.ListBlocksRequest(), timeout=10)
    (held,) = listing.ranks
    assert held.rank == 1 and dict(zip(held.block_keys, held.positions, strict=True))[keys[1]] == 1
    assert keys[0] not in held.block_keys  # position 0 was rank 0's under CP2
    assert sorted(listing.served_keys) == sorted(held.block_keys)  # a CP1 worker owns every position
    desc = _stub(channels, 1).Describe(worker_pb2.DescribeRequest(), timeout=10)
    assert (desc.worker, desc.degree, desc.epoch) == (1, 1, reply.epoch)
    # rank 1 now leads a CP1 worker holding half of the prefix; copy the rest from worker 0
    copy = _stub(channels, 1).CopyBlocks(
        worker_pb2.CopyBlocksRequest(source_worker=0, block_keys=list(keys)), timeout=60
    )
    assert (copy.copied_blocks, copy.skipped_blocks) == (1, 1)
    out = _stub(channels, 1).Prefill(worker_pb2.PrefillRequest(request_id="r1", token_ids=tokens + [9]), timeout=60)
    assert out.cached_tokens == 16 and out.degree == 1
    # a copy of blocks the source never held: refused, nothing copied, still serving
    absent = block_keys(random_tokens(16, seed=3), BLOCK)
    with pytest.raises(grpc.RpcError) as err:
        _stub(channels, 1).CopyBlocks(worker_pb2.CopyBlocksRequest(source_worker=0, block_keys=list(absent)), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "source worker 0 lacks 2 of the 2 requested blocks" in err.value.details()
    again = _stub(channels, 0).Prefill(worker_pb2.PrefillRequest(request_id="r0", token_ids=tokens), timeout=60)
    assert again.degree == 1 and again.cached_tokens == 8  # rank 0 owns every block of a CP1 worker; it held block 0
