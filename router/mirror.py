"""The router's index with Redis behind it: a local mirror that placement reads, Redis as the shared copy.

Placement must not wait for the network: the routing core reads a
:class:`~vertumnus.core.trie.PrefixTrie` in this process (microseconds).
:class:`MirroredStore` is that trie, plus Redis
(:class:`~vertumnus.router.redis_store.RedisTrieStore`) kept in step:

- **writes** (the workers' cache events) are applied to the local trie at
  once — it validates them — and queued for Redis, which one task applies in
  order, off the event loop: each batch a Lua script, the batches queued within
  ``WRITE_INTERVAL_S`` of each other in one pipeline (one round trip); a batch
  Redis refuses (it disagrees with the local view) has its worker written back
  whole, as after an outage;
- **Redis down**: the router keeps serving from its local view
  (``degraded``) and remembers which workers changed; when Redis answers
  again, those workers' entries are written back whole (cleared, then every
  block), so the shared copy converges to what the workers hold. A Redis
  that restarted empty between two writes is noticed by its **incarnation**
  (checked every ``retry_s``): then every worker is written back;
- **a replica that follows** (``follow=True``, the router's
  ``--index-source redis``) does not subscribe to the workers at all: it
  applies the Redis change stream to its mirror, so two replicas see the
  same index. It reads the stream's position before the snapshot it starts
  from, so that no change falls between the two. A follower that fell behind
  the stream, whose mirror refuses a change, or that started while Redis was
  down re-reads the index whole; it never stops following.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

from vertumnus.core.store import BlockInfo, Change, StoredBlock, StoreError
from vertumnus.core.trie import PrefixTrie

__all__ = ["WRITE_INTERVAL_S", "MirroredStore", "redis_store_for"]

_log = logging.getLogger("vertumnus.router.mirror")

_REWRITE_BATCH = 10_000
"""Blocks per script when a worker's entries are written back whole."""

_GROUP = 256
"""Queued event batches sent in one pipeline, at most (a bound on one round trip's size)."""

WRITE_INTERVAL_S = 0.01
"""How long the writer waits after a batch is queued before it sends what queued
meanwhile with it, in one pipeline. A busy router sends several batches per round trip
and per thread hop: with instant workers, 1.22x the requests per second through a router
with Redis, at 0.85x the CPU per request (docs/benchmarks/serving.md, "The Redis writer
groups its batches"). A replica that follows the store sees a change up to this much
later (it reads the stream every 50 ms); placement here never waits for Redis."""


def redis_store_for(
    url: str, pool: str, profile: str, *, follow: bool = False, password_env: str | None = None
) -> MirroredStore:
    """A mirrored store on the Redis at ``url``, in the pool's and model's namespace.

    ``password_env``: the variable holding the password (router.json's
    ``redis.passwordEnv``), read before ``VERTUMNUS_REDIS_PASSWORD``; see
    :func:`~vertumnus.router.redis_conn.redis_client`.
    """
    from vertumnus.router.redis_conn import redis_client
    from vertumnus.router.redis_store import RedisTrieStore

    namespace = f"{pool}/{profile}".replace("{", "").replace("}", "")
    client = redis_client(url, password_env=password_env)
    return MirroredStore(RedisTrieStore(client, namespace), client, follow=follow)


def _drain(
    queue: asyncio.Queue[tuple[Any, ...]], most: int | None, *, done: bool = False
) -> list[tuple[Any, ...]]:
    """What ``queue`` holds now (at most ``most``), without waiting; ``done``: each
    marked done at once."""
    out: list[tuple[Any, ...]] = []
    while (most is None or len(out) < most) and not queue.empty():
        out.append(queue.get_nowait())
        if done:
            queue.task_done()
    return out


class MirroredStore:
    """A :class:`~vertumnus.core.store.TrieStore`: the local trie, with Redis kept in step."""

    def __init__(
        self,
        remote: Any,
        client: Any = None,
        *,
        follow: bool = False,
        retry_s: float = 1.0,
        write_interval_s: float = WRITE_INTERVAL_S,
    ) -> None:
        self.remote = remote
        self.client = client
        self.local = PrefixTrie(remote.namespace)
        self.follow = follow
        self.retry_s = retry_s
        self.write_interval_s = write_interval_s
        self.degraded = False
        self._queue: asyncio.Queue[tuple[Any, ...]] | None = None
        self._dirty: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.writes = 0
        self.rewrites = 0
        self.block = self.local.block
        self._incarnation: str | None = None

    # -- life cycle --------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer (and, for a follower, the stream reader)."""
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        if self.follow:
            cursor: int | None
            try:
                cursor = await self._resync()
            except ConnectionError:
                cursor = None  # the follower reads the index whole once Redis answers
                self.degraded = True
            self._tasks.append(loop.create_task(self._follow(cursor), name="index-follow"))
        else:
            self._tasks.append(loop.create_task(self._write(), name="index-write"))
            self._tasks.append(loop.create_task(self._watch(), name="index-watch"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued write reached Redis (False if it is down)."""
        assert self._queue is not None
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            return False
        return not self.degraded

    # -- TrieStore: reads from the mirror ----------------------------------------

    @property
    def namespace(self) -> str:
        return self.local.namespace

    @property
    def cursor(self) -> int:
        return self.local.cursor

    def __len__(self) -> int:
        return len(self.local)

    def matched_blocks(self, keys: Sequence[int]) -> Mapping[int, int]:
        return self.local.matched_blocks(keys)

    def path(self, keys: Sequence[int]) -> Sequence[BlockInfo]:
        return self.local.path(keys)

    def children(self, key: int) -> Set[int]:
        return self.local.children(key)

    def holders(self, key: int) -> Set[int]:
        return self.local.holders(key)

    def worker_keys(self, worker: int) -> Set[int]:
        return self.local.worker_keys(worker)

    def worker_block_count(self, worker: int) -> int:
        return self.local.worker_block_count(worker)

    def workers(self) -> Set[int]:
        return self.local.workers()

    def changes(self, since: int) -> tuple[int, Sequence[Change] | None]:
        return self.local.changes(since)

    # -- TrieStore: writes to both -------------------------------------------------

    def apply(
        self,
        worker: int,
        stored: Iterable[StoredBlock | tuple[int, int, int | None]] = (),
        removed: Iterable[int] = (),
        *,
        cleared: bool = False,
    ) -> int:
        items = list(stored)
        gone = list(removed)
        cursor = self.local.apply(worker, items, gone, cleared=cleared)  # validates: may refuse
        if self._queue is not None and not self.follow:
            self._queue.put_nowait(("apply", worker, items, gone, cleared))
        return cursor

    def drop_worker(self, worker: int) -> int:
        cursor = self.local.drop_worker(worker)
        if self._queue is not None and not self.follow:
            self._queue.put_nowait(("drop", worker))
        return cursor

    # -- the writer ----------------------------------------------------------------

    async def _write(self) -> None:
        """The one task that writes to Redis: what is queued, in order, a group at a
        time (every op queued within ``write_interval_s`` of the first, up to ``_GROUP``,
        in one pipeline: a busy router pays one round trip and one thread hop per group,
        not per batch); and, while degraded, the write-back once Redis answers."""
        assert self._queue is not None
        queue = self._queue
        while True:
            if self.degraded:
                await self._recover(queue)
                continue
            taken = [await queue.get()]
            if self.write_interval_s:
                await asyncio.sleep(self.write_interval_s)  # let the next batches queue
            taken += _drain(queue, _GROUP - 1)
            ops = [op for op in taken if op[0] != "wake"]
            try:
                if self.degraded:  # the watch found a Redis that started over
                    self._dirty.update(op[1] for op in ops)
                    continue
                if not ops:
                    continue
                try:
                    refused = await asyncio.to_thread(self._send, ops)
                    self.writes += len(ops)
                except ConnectionError as e:
                    _log.warning("redis unavailable, serving from the local index: %s", e)
                    self._dirty.update(op[1] for op in ops)
                    self.degraded = True
                    continue
                if refused:
                    # Redis and the local view disagree on these workers (the local
                    # trie accepted the batch): write them back whole.
                    _log.warning(
                        "redis refused a batch, writing the worker back: %s", refused[0][1]
                    )
                    self._dirty.update(w for w, _ in refused)
                    self.degraded = True
            finally:
                for _ in taken:
                    queue.task_done()

    async def _watch(self) -> None:
        """Notice a Redis that started over (empty) while we were writing to it."""
        while True:
            await asyncio.sleep(self.retry_s)
            if self.degraded:
                continue
            try:
                now = await asyncio.to_thread(lambda: self.remote.incarnation)
            except ConnectionError:
                continue
            if self._incarnation is not None and now != self._incarnation and self.local.workers():
                _log.warning(
                    "redis started over (incarnation %s -> %s): writing the index back",
                    self._incarnation,
                    now,
                )
                self.mark_all_dirty()
                self.degraded = True
                if self._queue is not None:
                    self._queue.put_nowait(("wake", -1))  # the writer may be waiting for work
            self._incarnation = now

    def _send(self, ops: Sequence[tuple[Any, ...]]) -> list[tuple[int, StoreError]]:
        """Apply ``ops`` to Redis in order, in one round trip; the workers whose batch it
        refused, each with the reason."""
        batches = [
            (op[1], op[2], op[3], op[4]) if op[0] == "apply" else (op[1], (), (), True)
            for op in ops
        ]
        replies = self.remote.apply_many(batches)
        return [
            (b[0], r) for b, r in zip(batches, replies, strict=True) if isinstance(r, StoreError)
        ]

    async def _recover(self, queue: asyncio.Queue[tuple[Any, ...]]) -> None:
        """Degraded: wait for Redis, then write back every worker that changed meanwhile.

        What is queued is taken in first (its workers marked), then the workers are
        snapshotted, with no await between: each snapshot holds every event queued so
        far, and the events queued during the write-back stay in the queue, to be sent
        after it on top of the snapshots, in order."""
        while True:
            self._mark_queued(queue)
            try:
                await asyncio.to_thread(self.remote.cursor.__int__)
                break
            except ConnectionError:
                await asyncio.sleep(self.retry_s)
        self._mark_queued(queue)  # what came during the probe
        dirty, self._dirty = self._dirty, set()
        batches = [(w, self._snapshot(w)) for w in sorted(dirty)]
        try:
            for w, items in batches:
                await self._rewrite(w, items)
        except ConnectionError:
            self._dirty |= dirty  # written again whole at the next try; degraded still
            await asyncio.sleep(self.retry_s)
            return
        self.degraded = False
        with contextlib.suppress(ConnectionError):
            self._incarnation = await asyncio.to_thread(lambda: self.remote.incarnation)
        _log.info("redis back: %d workers written back", len(batches))

    def _mark_queued(self, queue: asyncio.Queue[tuple[Any, ...]]) -> None:
        """Take in what is queued, marking its workers to be written back whole."""
        self._dirty.update(op[1] for op in _drain(queue, None, done=True) if op[0] != "wake")

    async def _rewrite(self, worker: int, items: Sequence[tuple[int, int, int | None]]) -> None:
        """``worker``'s entries in Redis replaced by ``items``: a drop, then bounded
        batches (one huge script would hold Redis, and outlast the client's timeout, for
        a big worker)."""
        await asyncio.to_thread(self.remote.drop_worker, worker)
        try:
            for i in range(0, len(items), _REWRITE_BATCH):
                await asyncio.to_thread(self.remote.apply, worker, items[i : i + _REWRITE_BATCH])
        except StoreError as e:
            # Another worker's entries contradict this one's (a store left by something
            # else in this namespace): Redis keeps the worker dropped (replicas that
            # follow it see none of its blocks); this replica's placement reads its
            # local view and is not affected.
            _log.error("redis refuses worker %d's entries, left out of it: %s", worker, e)
            return
        self.rewrites += 1

    def _snapshot(self, worker: int) -> list[tuple[int, int, int | None]]:
        items = []
        for k in self.local.worker_keys(worker):
            node = self.local.block(k)
            if node is not None:
                items.append((k, node.depth - 1, node.parent))
        items.sort(key=lambda i: i[1])  # parents first
        return items

    def mark_all_dirty(self) -> None:
        """Write every worker's entries back (e.g. after Redis lost its data)."""
        self._dirty |= set(self.local.workers())

    # -- the follower ------------------------------------------------------------------

    async def _follow(self, cursor: int | None) -> None:
        """Apply the change stream from ``cursor`` on. Re-read the whole index when
        there is no cursor (Redis was down at the start), when the stream no longer
        holds it, or when the mirror refuses a change: a follower never stops."""
        while True:
            await asyncio.sleep(0.05)
            try:
                if cursor is None:
                    cursor = await self._resync()
                    continue
                cursor_now, changes = await asyncio.to_thread(self.remote.changes, cursor)
                if changes is None:
                    cursor = await self._resync()
                    continue
                for c in changes:
                    await self._mirror(c)
                cursor = cursor_now if not changes else changes[-1].cursor
                self.degraded = False
            except ConnectionError:
                self.degraded = True
                await asyncio.sleep(self.retry_s)
            except StoreError as e:
                _log.warning(
                    "the index's change stream contradicts the mirror (%s): re-reading it", e
                )
                cursor = None

    async def _resync(self) -> int:
        """The stream's position, then the whole index; returns the position.

        In this order: a change made between the two reads is in the snapshot and
        is applied again from the stream, harmlessly. The other order (snapshot,
        then position) would lose such a change for good. Raises ConnectionError
        when Redis does not answer.
        """
        cursor = await asyncio.to_thread(lambda: self.remote.cursor)
        if not await self._reload():
            raise ConnectionError("redis went away while the index was read")
        return int(cursor)

    async def _mirror(self, change: Change) -> None:
        infos = await asyncio.to_thread(self.remote.blocks, change.stored)
        items = [
            (k, b.depth - 1, b.parent) for k in change.stored if (b := infos.get(k)) is not None
        ]
        items.sort(key=lambda i: i[1])
        self.local.apply(change.worker, items, change.removed, cleared=change.dropped)

    async def _reload(self) -> bool:
        """Read the whole index from Redis into the mirror (False: Redis is down)."""

        def read() -> dict[int, list[tuple[int, int, int | None]]]:
            out = {}
            for w in self.remote.workers():
                infos = self.remote.blocks(self.remote.worker_keys(w))
                items = [(k, b.depth - 1, b.parent) for k, b in infos.items()]
                items.sort(key=lambda i: i[1])
                out[w] = items
            return out

        try:
            view = await asyncio.to_thread(read)
        except ConnectionError:
            self.degraded = True
            return False
        for w in list(self.local.workers()):
            if w not in view:
                self.local.drop_worker(w)
        for w, items in view.items():
            self.local.apply(w, items, cleared=True)
        return True
