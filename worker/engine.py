"""The engine: CP workers of the current epoch over one pool of rank processes.

This is the ``Engine`` shell of design.md section 9 for our torch backend. It
owns a :class:`~vertumnus.worker.pool.RankPool` and, per epoch, a grouping of
its ranks into workers (:mod:`vertumnus.worker.lattice`). Each worker has a
dispatcher (:mod:`vertumnus.worker.dispatch`) that batches whatever requests
are queued into one engine step, so a step is the unit at which nothing else
happens on those ranks:

- a **prefill** waits in its worker's queue (queue time), then runs as part of
  a step (execution time);
- **drain** stops admission and waits for the queue to empty;
- an **epoch switch** regroups drained workers between steps; the ranks keep
  their weights and KV blocks, and blocks owned under the new geometry are
  immediately reusable (the rest are found missing and count as misses until
  copied — the lazy reconciliation of design.md section 5);
- a **block copy** holds both workers between steps and moves only the blocks
  the destination lacks, re-partitioned to the destination's geometry
  (planned by :mod:`vertumnus.worker.copies`).

Errors the caller can fix raise :class:`InvalidRequest` or :class:`NotReady`;
the engine stays up.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from vertumnus.worker.blocks import block_owner
from vertumnus.worker.copies import plan_copy
from vertumnus.worker.dispatch import PrefillOutcome, WorkerRunner
from vertumnus.worker.errors import InvalidRequest, NotReady
from vertumnus.worker.lattice import WorkerSlot, grouping
from vertumnus.worker.pool import RankPool
from vertumnus.worker.rank import (
    EvictBlocks,
    ListBlocks,
    QueryBlocks,
    RankSpec,
    ReadBlocks,
    RecvBlocks,
    SendBlocks,
    SetEpoch,
)
from vertumnus.worker.step import StepRequest


@dataclass(frozen=True)
class CopyReport:
    copied_blocks: int
    skipped_blocks: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class WorkerEvent:
    """A cache event as published: which worker and epoch it belongs to."""

    kind: str
    block_keys: tuple[int, ...]
    positions: tuple[int, ...]
    rank: int
    worker: int
    epoch: int


class Engine:
    """CP workers over a pool of ``world`` rank processes; see the module docstring."""

    def __init__(
        self,
        world: int,
        degrees: Sequence[int],
        spec: RankSpec | None = None,
        *,
        max_tokens: int = 8192,
        max_batch_tokens: int = 16384,
    ) -> None:
        self.spec = spec or RankSpec()
        self.max_tokens, self.max_batch_tokens = max_tokens, max_batch_tokens
        slots = grouping(degrees, world)  # validate before spawning anything
        self._subscribers: list[queue.Queue] = []
        self._sub_lock = threading.Lock()
        self._rank_worker: dict[int, int] = {}
        self._control = threading.Lock()  # one epoch switch or copy plan at a time
        self.epoch = 0
        self.pool = RankPool(world, self.spec, on_events=self._publish)
        self.vocab_size = self.pool.info[0]["vocab_size"]
        self.block_bytes = self.pool.info[0]["block_bytes"]
        self.workers: dict[int, WorkerRunner] = {}
        try:
            self._activate(1, slots)
        except Exception:
            self.pool.close()
            raise

    @property
    def world(self) -> int:
        return self.pool.world

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def grouping(self) -> list[WorkerSlot]:
        return sorted(w.slot for w in self.workers.values())

    # -- requests --------------------------------------------------------------

    def worker(self, worker_id: int) -> WorkerRunner:
        w = self.workers.get(worker_id)
        if w is None:
            raise NotReady(
                f"no worker starts at rank {worker_id} in epoch {self.epoch}; "
                f"workers: {[f'{s.first}:CP{s.degree}' for s in self.grouping()]}"
            )
        return w

    def submit(
        self, worker_id: int, request_id: str, tokens: Sequence[int], *,
        use_cache: bool = True, return_hidden: bool = False,
    ) -> Future:
        tokens = tuple(int(t) for t in tokens)
        if not tokens:
            raise InvalidRequest(f"request {request_id!r}: token_ids is empty")
        if len(tokens) > self.max_tokens:
            raise InvalidRequest(
                f"request {request_id!r}: {len(tokens)} tokens exceed the engine maximum of {self.max_tokens}"
            )
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"request {request_id!r}: token id {bad} outside the vocabulary [0, {self.vocab_size})")
        opts = {"use_cache": use_cache, "return_hidden": return_hidden}
        return self.worker(worker_id).submit(StepRequest(request_id, tokens), opts)

    def prefill(self, worker_id: int, request_id: str, tokens: Sequence[int], **kw) -> PrefillOutcome:
        return self.submit(worker_id, request_id, tokens, **kw).result()

    def drain(self, worker_id: int) -> None:
        self.worker(worker_id).drain()

    def resume(self, worker_id: int) -> None:
        self.worker(worker_id).resume()

    # -- regrouping ----------------------------------------------------------------

    def switch_epoch(self, epoch: int, degrees: Sequence[int]) -> float:
        """Activate a new grouping at a step boundary; returns the switch seconds.

        Workers whose ranks regroup must have been drained (design.md section 5,
        step 1); workers that stay as they are keep serving throughout.
        """
        slots = grouping(degrees, self.world)
        with self._control:
            if epoch <= self.epoch:
                raise NotReady(f"epoch {epoch} is not newer than the current epoch {self.epoch}")
            changing = [w for w in self.workers.values() if w.slot not in slots]
            undrained = [w.slot.first for w in changing if not w.draining]
            if undrained:
                raise NotReady(f"workers {undrained} must be drained before epoch {epoch} regroups them")
            for w in changing:
                w.drain()
            return self._activate(epoch, slots)

    def _activate(self, epoch: int, slots: list[WorkerSlot]) -> float:
        keep = {s for s in slots if s.first in self.workers and self.workers[s.first].slot == s}
        leaving = [w for w in self.workers.values() if w.slot not in keep]
        for w in leaving:
            w.step_lock.acquire()  # park: no step may start on these ranks
        try:
            started = time.perf_counter()
            new = [s for s in slots if s not in keep]
            self.pool.call({r: SetEpoch(epoch, s) for s in new for r in s.ranks})
            seconds = time.perf_counter() - started
        finally:
            for w in leaving:
                w.step_lock.release()
        for w in leaving:
            w.stop()
            del self.workers[w.slot.first]
        for s in new:
            self.workers[s.first] = WorkerRunner(self.pool, s, epoch, self.max_batch_tokens)
            for r in s.ranks:
                self._rank_worker[r] = s.first
        for s in keep:  # the commit makes every worker of the new grouping schedulable
            self.workers[s.first].epoch = epoch
            self.workers[s.first].resume()
        self.epoch = epoch
        return seconds

    # -- blocks ------------------------------------------------------------------

    def copy_blocks(self, source: int, destination: int, keys: Sequence[int]) -> CopyReport:
        """Copy the prefix ``keys`` (chained keys, root first) from worker ``source`` to
        ``destination``, re-partitioned to the destination's geometry; only blocks the
        destination lacks move. Refuses, copying nothing, if the source lacks any of them."""
        keys = tuple(int(k) for k in keys)
        if not keys:
            raise InvalidRequest("copy: block_keys is empty")
        if source == destination:
            raise InvalidRequest(f"copy: source and destination are the same worker {source}")
        src, dst = self.worker(source), self.worker(destination)
        first, second = sorted((src, dst), key=lambda w: w.slot.first)
        with self._control, first.step_lock, second.step_lock:
            holders = self.pool.call({r: QueryBlocks(keys) for r in (*src.slot.ranks, *dst.slot.ranks)})
            plan = plan_copy(keys, holders, src.slot, dst.slot)
            if plan.missing:
                j, key = plan.missing[0]
                raise NotReady(
                    f"copy: source worker {source} lacks {len(plan.missing)} of the {len(keys)} requested blocks "
                    f"(first at position {j}, key {key:#018x}); nothing copied"
                )
            started = time.perf_counter()
            cmds = {r: SendBlocks({d: tuple(ks) for d, ks in m.items()}) for r, m in plan.sends.items()}
            cmds.update({r: RecvBlocks({s: tuple(bs) for s, bs in m.items()}) for r, m in plan.receives.items()})
            answers = self.pool.call(cmds) if cmds else {}
            seconds = time.perf_counter() - started
        copied = sum(answers[r] for r in plan.receives)
        return CopyReport(copied, plan.skipped, copied * self.block_bytes, seconds)

    def read_blocks(self, worker_id: int, keys: Sequence[int]) -> dict:
        """The bytes of ``keys`` as held by each block's owner rank (tests, round trips)."""
        w = self.worker(worker_id)
        with w.step_lock:
            answers = self.pool.call({r: ReadBlocks(tuple(keys)) for r in w.slot.ranks})
        out = {}
        for j, key in enumerate(keys):
            owner = w.slot.first + block_owner(j, w.slot.degree)
            if key in answers[owner]:
                out[key] = answers[owner][key]
        return out

    def list_blocks(self, worker_id: int) -> tuple[dict[int, list[tuple[int, int]]], list[int]]:
        """Per rank, the (key, position) of every block it holds; and the keys the worker
        serves, i.e. those held by their owner rank under the worker's geometry."""
        w = self.worker(worker_id)
        with w.step_lock:
            held = self.pool.call({r: ListBlocks() for r in w.slot.ranks})
        served = [
            key
            for rank, blocks in sorted(held.items())
            for key, position in blocks
            if w.slot.first + block_owner(position, w.slot.degree) == rank
        ]
        return held, served

    def evict_blocks(self, worker_id: int, keys: Sequence[int]) -> int:
        """Reclaim: drop ``keys`` from every rank of the worker; returns blocks removed."""
        w = self.worker(worker_id)
        with w.step_lock:
            answers = self.pool.call({r: EvictBlocks(tuple(keys)) for r in w.slot.ranks})
        return sum(len(v) for v in answers.values())

    # -- events --------------------------------------------------------------------

    def subscribe(self) -> queue.Queue:
        q: queue.Queue = queue.Queue()
        with self._sub_lock:
            self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue) -> None:
        with self._sub_lock:
            if q in self._subscribers:
                self._subscribers.remove(q)

    def _publish(self, rank: int, events: list) -> None:
        worker = self._rank_worker.get(rank, rank)
        out = [WorkerEvent(e.kind, e.block_keys, e.positions, e.rank, worker, self.epoch) for e in events]
        with self._sub_lock:
            for q in self._subscribers:
                for e in out:
                    q.put(e)

    def close(self) -> None:
        for w in list(self.workers.values()):
            w.stop()
        self.pool.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
