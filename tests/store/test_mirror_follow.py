"""A router replica that follows the index through Redis (``MirroredStore(follow=True)``).

Real ``redis-server``: a writer store applies blocks as the replica that owns
the workers would, and the follower must end up with the same view. These
pin the start of following — the snapshot and the stream position taken in
the right order, and a Redis that is down when the follower starts — which
the end-to-end replica tests (``e2e/test_pool_redis.py``) only meet by chance.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import pytest

if os.environ.get("VERTUMNUS_SKIP_REDIS") == "1":
    pytest.skip(
        "VERTUMNUS_SKIP_REDIS=1: the tests against a real redis-server are skipped",
        allow_module_level=True,
    )

from tests.redis_server import RedisServer  # noqa: E402
from vertumnus.router.mirror import MirroredStore  # noqa: E402
from vertumnus.router.redis_store import RedisTrieStore  # noqa: E402

_ns = itertools.count()


async def _until(probe, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        await asyncio.sleep(0.02)
    return bool(probe())


def test_a_write_between_the_snapshot_and_the_first_read_of_the_stream_is_not_lost(
    redis_server,
) -> None:
    ns = f"follow-{next(_ns)}"
    writer = RedisTrieStore(redis_server.client(), ns)
    writer.apply(0, [(11, 0, None)])
    follower = MirroredStore(RedisTrieStore(redis_server.client(), ns), follow=True)
    snapshot = follower._reload

    async def snapshot_then_a_write() -> bool:
        read = await snapshot()
        writer.apply(0, [(12, 1, 11)])  # lands after the snapshot was read
        return read

    follower._reload = snapshot_then_a_write  # type: ignore[method-assign]

    async def scenario() -> set[int]:
        await follower.start()
        try:
            await _until(lambda: set(follower.worker_keys(0)) == {11, 12})
            return set(follower.worker_keys(0))
        finally:
            await follower.stop()

    assert asyncio.run(scenario()) == {11, 12}


def test_a_follower_started_while_redis_is_down_follows_once_it_answers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")  # not started yet
    follower = MirroredStore(RedisTrieStore(server.client(), "down"), follow=True, retry_s=0.1)

    async def scenario() -> tuple[bool, set[int]]:
        await follower.start()  # Redis is down: no error, the follower waits
        try:
            down = follower.degraded
            server.start()
            writer = RedisTrieStore(server.client(), "down")
            writer.apply(3, [(21, 0, None), (22, 1, 21)])
            await _until(lambda: set(follower.worker_keys(3)) == {21, 22})
            writer.apply(3, [], [22])
            await _until(lambda: set(follower.worker_keys(3)) == {21})
            return down, set(follower.worker_keys(3))
        finally:
            await follower.stop()

    try:
        down, held = asyncio.run(scenario())
    finally:
        server.stop()
    assert down
    assert held == {21}
    assert not follower.degraded


def test_a_change_the_mirror_refuses_makes_the_follower_read_the_index_again(
    redis_server,
) -> None:
    ns = f"follow-{next(_ns)}"
    writer = RedisTrieStore(redis_server.client(), ns)
    follower = MirroredStore(RedisTrieStore(redis_server.client(), ns), follow=True)

    async def scenario() -> tuple[set[int], set[int]]:
        await follower.start()
        try:
            # The mirror holds what Redis never had (a stale entry): block 31 at
            # position 0 for a worker 5. Redis then names block 31 at position 1.
            follower.local.apply(5, [(31, 0, None)])
            writer.apply(0, [(30, 0, None), (31, 1, 30)])
            await _until(lambda: set(follower.worker_keys(0)) == {30, 31})
            return set(follower.worker_keys(0)), set(follower.workers())
        finally:
            await follower.stop()

    held, workers = asyncio.run(scenario())
    assert held == {30, 31}  # Redis's view, read again whole
    assert workers == {0}  # the stale entry is gone
