"""Talking to the CP engines: channels, discovery of their workers, and typed calls.

An **engine** is one NVLink domain's host process: ``world`` ranks, one gRPC
endpoint per rank (``vertumnus serve``, or an SGLang adapter speaking the
same protocol). A worker is served by the endpoint of its first rank. The
router is configured with each engine's first address (``HOST:PORT`` of
rank 0, the domain being the engine's position in the list) and discovers
its workers by asking every rank's endpoint who it serves.

Channels are kept per endpoint and reused: after a regroup, the same rank's
endpoint serves a new worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from vertumnus._proto import worker_pb2, worker_pb2_grpc
from vertumnus.core.lattice import Slot

__all__ = ["Endpoints", "EngineInfo", "WorkerAddress", "discover"]

_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]


@dataclass(frozen=True, slots=True)
class WorkerAddress:
    """Where a worker sits and which endpoint serves it."""

    slot: Slot
    address: str
    cache_blocks: int = 0
    """KV cache capacity of the worker, in blocks."""

    @property
    def id(self) -> int:
        return self.slot.worker


@dataclass(frozen=True)
class EngineInfo:
    """What one engine (domain) said about itself."""

    domain: int
    address: str
    """Rank 0's endpoint."""
    world: int
    epoch: int
    incarnation: int
    block_size: int
    max_tokens: int
    vocab_size: int
    cache_blocks_per_rank: int
    workers: tuple[WorkerAddress, ...]

    def rank_address(self, rank: int) -> str:
        return rank_address(self.address, rank)


def rank_address(base: str, rank: int) -> str:
    """The endpoint of ``rank`` of an engine whose rank 0 listens on ``base``."""
    host, _, port = base.rpartition(":")
    return f"{host}:{int(port) + rank}"


class Endpoints:
    """One channel and stub per endpoint address, created on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = worker_pb2_grpc.WorkerStub(channel)
        return stub

    async def close(self) -> None:
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        await asyncio.gather(*(c.close(grace=None) for c in channels), return_exceptions=True)


async def discover(
    endpoints: Endpoints, domain: int, address: str, timeout_s: float = 5.0
) -> EngineInfo:
    """Ask an engine's ranks which workers they serve. Raises ``grpc.aio.AioRpcError``
    if rank 0 does not answer, ValueError if the engine's answers do not fit together."""
    first = await endpoints.stub(address).Describe(worker_pb2.DescribeRequest(), timeout=timeout_s)
    world = first.world
    if world < 1:
        raise ValueError(f"engine {address} reports {world} ranks")
    answers = await asyncio.gather(
        *(
            endpoints.stub(rank_address(address, r)).Describe(
                worker_pb2.DescribeRequest(), timeout=timeout_s
            )
            for r in range(1, world)
        ),
        return_exceptions=True,
    )
    workers = [_worker(domain, address, first)]
    for r, a in enumerate(answers, 1):
        if isinstance(a, grpc.aio.AioRpcError):
            if a.code() == grpc.StatusCode.FAILED_PRECONDITION:
                continue  # the rank leads no worker in this epoch
            raise a
        if isinstance(a, BaseException):
            raise a
        workers.append(_worker(domain, rank_address(address, r), a))
    epochs = {first.epoch} | {w.epoch for w in answers if not isinstance(w, BaseException)}
    if len(epochs) != 1:
        raise ValueError(
            f"engine {address} answered from several epochs {sorted(epochs)} (a switch is under way)"
        )
    return EngineInfo(
        domain=domain,
        address=address,
        world=world,
        epoch=first.epoch,
        incarnation=first.incarnation,
        block_size=first.block_size,
        max_tokens=first.max_tokens,
        vocab_size=first.vocab_size,
        cache_blocks_per_rank=first.cache_blocks // max(1, first.degree),
        workers=tuple(sorted(workers, key=lambda w: w.slot.offset)),
    )


def _worker(domain: int, address: str, d: worker_pb2.DescribeResponse) -> WorkerAddress:
    return WorkerAddress(Slot(d.worker, d.degree, domain, d.offset), address, d.cache_blocks)


def grouping_request(epoch: int, slots: Sequence[Slot]) -> worker_pb2.EpochRequest:
    """The engine's Epoch request for a domain's new grouping."""
    return worker_pb2.EpochRequest(
        epoch=epoch,
        grouping=[
            worker_pb2.WorkerSlot(worker=s.worker, degree=s.degree, offset=s.offset) for s in slots
        ],
    )
