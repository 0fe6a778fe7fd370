"""The writing side of the Redis-backed index (``MirroredStore``, not following).

Real ``redis-server``. The router applies each worker's cache events to its local trie
and queues them for Redis; a writer task sends what queued within
``write_interval_s`` as one pipeline. These pin what that grouping must keep: every
batch reaches Redis, in order (a removal after its store, a drop after both), in fewer
round trips than batches; and a batch Redis refuses (it disagrees with the local view)
has its worker written back whole instead of stopping the writer, as it once did.
"""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest

if os.environ.get("VERTUMNUS_SKIP_REDIS") == "1":
    pytest.skip(
        "VERTUMNUS_SKIP_REDIS=1: the tests against a real redis-server are skipped",
        allow_module_level=True,
    )

from vertumnus.router.mirror import MirroredStore  # noqa: E402
from vertumnus.router.redis_store import RedisTrieStore  # noqa: E402

_ns = itertools.count()


class _Counting(RedisTrieStore):
    """A real store that counts the pipelines the writer sends."""

    __slots__ = ("pipelines",)

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.pipelines: list[int] = []

    def apply_many(self, batches):  # type: ignore[no-untyped-def]
        self.pipelines.append(len(batches))
        return super().apply_many(batches)


def _view(store, workers) -> dict[int, set[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    """Per worker, (key, depth) of each block it holds."""
    return {w: {(k, store.block(k).depth) for k in store.worker_keys(w)} for w in workers}


def test_batches_queued_together_reach_redis_in_order_in_few_round_trips(redis_server) -> None:
    ns = f"write-{next(_ns)}"
    remote = _Counting(redis_server.client(), ns)
    mirror = MirroredStore(remote, write_interval_s=0.05)

    async def scenario() -> None:
        await mirror.start()
        try:
            for w in range(4):
                root = 1000 * (w + 1)
                for i in range(10):  # a chain stored block by block
                    mirror.apply(w, [(root + i, i, root + i - 1 if i else None)])
                mirror.apply(w, [], [root + 9, root + 8])  # then its tail removed
            mirror.apply(4, [(9000, 0, None)])
            mirror.drop_worker(4)  # stored, then dropped: Redis must end without it
            assert await mirror.flush(5.0)
        finally:
            await mirror.stop()

    asyncio.run(scenario())
    reader = RedisTrieStore(redis_server.client(), ns)
    assert _view(reader, range(5)) == _view(mirror.local, range(5))
    assert all(len(v) == 8 for w, v in _view(reader, range(4)).items())
    assert reader.worker_keys(4) == frozenset()
    # 46 batches: every one sent, in a handful of pipelines rather than 46 round trips.
    assert sum(remote.pipelines) == 46 == mirror.writes
    assert len(remote.pipelines) <= 4, remote.pipelines


def test_a_batch_redis_refuses_has_its_worker_written_back_whole(redis_server) -> None:
    ns = f"write-{next(_ns)}"
    # Redis holds what an earlier pool of this name left: worker 0 with block 11 as a root.
    RedisTrieStore(redis_server.client(), ns).apply(0, [(11, 0, None)])
    mirror = MirroredStore(RedisTrieStore(redis_server.client(), ns), retry_s=0.05)

    async def scenario() -> bool:
        await mirror.start()
        try:
            # The local view (worker 0 just started over) has 11 under 10: Redis refuses.
            mirror.apply(0, [(10, 0, None), (11, 1, 10)])
            await asyncio.sleep(0.3)  # the refusal, then the rewrite
            mirror.apply(0, [(12, 2, 11)])  # the writer goes on after the refusal
            return await mirror.flush(5.0)
        finally:
            await mirror.stop()

    assert asyncio.run(scenario())
    reader = RedisTrieStore(redis_server.client(), ns)
    assert _view(reader, [0]) == _view(mirror.local, [0]) == {0: {(10, 1), (11, 2), (12, 3)}}
    assert mirror.rewrites == 1 and not mirror.degraded


def test_events_that_come_during_the_write_back_reach_redis_after_it(tmp_path) -> None:
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path / "redis").start()
    came: list[int] = []

    class EventsMeanwhile(MirroredStore):
        async def _rewrite(self, worker, items):  # type: ignore[no-untyped-def]
            if not came:  # an event of this worker while its entries are written back
                came.append(self.apply(0, [(103, 3, 102)]))
            await super()._rewrite(worker, items)

    mirror = EventsMeanwhile(
        RedisTrieStore(server.client(), "back"), retry_s=0.05, write_interval_s=0.0
    )

    async def scenario() -> tuple[bool, bool]:
        await mirror.start()
        try:
            mirror.apply(0, [(100, 0, None), (101, 1, 100)])
            assert await mirror.flush(5.0)
            server.kill()  # down, and back empty (no persistence)
            mirror.apply(0, [(102, 2, 101)], [100])  # a new block, and a placeholder left
            await asyncio.sleep(0.3)
            down = mirror.degraded
            server.start()
            for _ in range(100):
                await asyncio.sleep(0.05)
                if not mirror.degraded:
                    break
            return down, await mirror.flush(5.0)
        finally:
            await mirror.stop()

    try:
        down, flushed = asyncio.run(scenario())
        reader = RedisTrieStore(server.client(), "back")
        assert down and flushed and came
        assert _view(reader, [0]) == _view(mirror.local, [0]) == {0: {(101, 2), (102, 3), (103, 4)}}
    finally:
        server.stop()
