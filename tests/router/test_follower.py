"""The cache-event follower's rules, against a scripted stream (fast; the real engines are in e2e/).

Each case scripts what a worker's endpoint answers (streams of events,
snapshots, failures) and checks what the follower folds into the index and
what it counts: gaps and RESYNC → snapshot; a new incarnation or a sequence
going backwards → drop first; CLEARED → drop; unreachable too long → drop.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from vertumnus._proto import worker_pb2
from vertumnus.core.trie import PrefixTrie
from vertumnus.router.follower import Follower

K = worker_pb2.CacheEvent


def ev(seq: int, kind=K.STORED, keys=(), positions=None, inc: int = 7):  # type: ignore[no-untyped-def]
    keys = list(keys)
    positions = list(range(len(keys))) if positions is None else list(positions)
    parents = [keys[i - 1] if p else 0 for i, p in enumerate(positions)]
    return worker_pb2.CacheEvent(
        kind=kind,
        block_keys=keys,
        positions=positions,
        parent_keys=parents,
        worker=0,
        sequence=seq,
        incarnation=inc,
    )


def snapshot(seq: int, keys=(), inc: int = 7):  # type: ignore[no-untyped-def]
    keys = list(keys)
    served = [
        worker_pb2.ServedBlock(key=k, position=i, parent=keys[i - 1] if i else 0)
        for i, k in enumerate(keys)
    ]
    return worker_pb2.ListBlocksResponse(served=served, sequence=seq, incarnation=inc, worker=0)


class _Unavailable(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, None, None, details="down")


class ScriptedStub:
    """Answers ListBlocks from ``snapshots`` and each StreamCacheEvents call from
    ``streams`` (a list of event lists, or the string "down" for a failure)."""

    def __init__(self, snapshots, streams) -> None:  # type: ignore[no-untyped-def]
        self.snapshots = list(snapshots)
        self.streams = list(streams)
        self.requests: list[worker_pb2.StreamCacheEventsRequest] = []

    async def ListBlocks(self, request, timeout=None):  # type: ignore[no-untyped-def]
        if not self.snapshots:
            raise _Unavailable()
        item = self.snapshots.pop(0)
        if item == "down":
            raise _Unavailable()
        return item

    def StreamCacheEvents(self, request):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        script = self.streams.pop(0) if self.streams else "down"
        return _Stream(script)


class _Stream:
    def __init__(self, script) -> None:  # type: ignore[no-untyped-def]
        self.script = script

    async def wait_for_connection(self) -> None:
        if self.script == "down":
            raise _Unavailable()

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self._gen()

    async def _gen(self):  # type: ignore[no-untyped-def]
        if self.script == "down":
            raise _Unavailable()
        for e in self.script:
            yield e
        await asyncio.sleep(3600)  # the stream stays open

    def cancel(self) -> None:
        pass


def run(stub, *, resync_first=True, forget_after_s=10.0, seconds=0.3, incarnation=0):  # type: ignore[no-untyped-def]
    store = PrefixTrie()
    calls = []

    def apply(worker, stored, removed, cleared):  # type: ignore[no-untyped-def]
        calls.append((list(stored), list(removed), cleared))
        store.apply(worker, stored, removed, cleared=cleared)

    async def go():  # type: ignore[no-untyped-def]
        f = Follower(
            0,
            stub,
            apply,
            resync_first=resync_first,
            retry_s=0.01,
            forget_after_s=forget_after_s,
            incarnation=incarnation,
        )
        f.start()
        await asyncio.sleep(seconds)
        await f.stop()
        return f

    f = asyncio.run(go())
    return f, store, calls


def test_events_in_order_are_applied_after_the_first_snapshot() -> None:
    stub = ScriptedStub(
        [snapshot(2, [1, 2])], [[ev(3, keys=[1, 2, 3]), ev(4, K.REMOVED, keys=[3])]]
    )
    f, store, _ = run(stub)
    assert set(store.worker_keys(0)) == {1, 2}
    assert f.sequence == 4 and f.counts.events == 2 and f.counts.resyncs == 1 and f.counts.gaps == 0
    assert stub.requests[0].from_sequence == 2 and stub.requests[0].incarnation == 7


def test_a_gap_takes_a_snapshot_and_continues_after_it() -> None:
    stub = ScriptedStub(
        [snapshot(0), snapshot(9, [5, 6])],
        [[ev(1, keys=[1]), ev(3, keys=[1, 2, 3])], [ev(10, keys=[5, 6, 7])]],
    )
    f, store, _ = run(stub)
    assert f.counts.gaps == 1 and f.counts.resyncs == 2
    assert set(store.worker_keys(0)) == {5, 6, 7}  # the snapshot replaced the gapped history
    assert stub.requests[1].from_sequence == 9


def test_resync_from_the_engine_takes_a_snapshot() -> None:
    stub = ScriptedStub([snapshot(0), snapshot(4, [8])], [[ev(1, K.RESYNC)], []])
    f, store, _ = run(stub)
    assert set(store.worker_keys(0)) == {8} and f.counts.gaps == 1


def test_a_new_incarnation_drops_the_workers_entries_first() -> None:
    stub = ScriptedStub(
        [snapshot(1, [1, 2]), snapshot(0, [], inc=8)],
        [[ev(2, keys=[1, 2, 3]), ev(1, keys=[9], inc=8)], []],
    )
    f, store, calls = run(stub)
    assert f.incarnation == 8 and f.counts.drops >= 1
    assert set(store.worker_keys(0)) == set()
    assert any(c == ([], [], True) for c in calls)  # dropped before the new history


def test_a_sequence_going_backwards_drops_then_snapshots() -> None:
    stub = ScriptedStub(
        [snapshot(5, [1]), snapshot(2, [4])], [[ev(6, keys=[1, 2]), ev(3, keys=[1])], []]
    )
    f, store, _ = run(stub)
    assert f.counts.drops == 1 and set(store.worker_keys(0)) == {4}


def test_cleared_drops_everything_the_worker_had() -> None:
    stub = ScriptedStub([snapshot(1, [1, 2, 3])], [[ev(2, K.CLEARED), ev(3, keys=[7])]])
    f, store, _ = run(stub)
    assert set(store.worker_keys(0)) == {7} and f.counts.drops == 1


def test_a_worker_unreachable_too_long_leaves_the_index() -> None:
    stub = ScriptedStub([snapshot(1, [1, 2])] + ["down"] * 100, ["down"] * 100)
    f, store, _ = run(stub, forget_after_s=0.1, seconds=0.4)
    assert set(store.worker_keys(0)) == set()
    assert f.counts.drops == 1 and f.counts.reconnects == 1


def test_a_worker_created_by_a_switch_keeps_the_entries_its_plan_set() -> None:
    stub = ScriptedStub([], [[ev(1, keys=[1, 2])]])
    f, store, calls = run(stub, resync_first=False, incarnation=7)
    assert f.counts.resyncs == 0 and f.sequence == 1
    assert all(not c[2] for c in calls)  # nothing cleared: the reconciliation entries stay


@pytest.mark.parametrize("seq", [0, 1])
def test_the_stream_is_asked_to_start_after_what_is_known(seq) -> None:
    stub = ScriptedStub([snapshot(seq, [1])], [[]])
    f, _, _ = run(stub)
    assert stub.requests[0].from_sequence == seq
