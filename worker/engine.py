"""The engine: CP workers of the current epoch over one pool of rank processes.

This is the ``Engine`` shell of design.md section 9 for our torch backend. It
owns a :class:`~vertumnus.worker.pool.RankPool` (one NVLink domain) and, per
epoch, a grouping of its ranks into workers, each a
:class:`vertumnus.core.lattice.Slot` — the pool's one vocabulary of shape:
a pool-level worker id chosen by the controller, a degree, domain 0 and the
first rank as offset (:mod:`vertumnus.worker.lattice`; a plain list of
degrees gives the default ids = first ranks). Every method that takes a
worker takes its id. Each worker has a dispatcher
(:mod:`vertumnus.worker.dispatch`) that batches whatever requests are queued
into one engine step, so a step is the unit at which nothing else happens on
those ranks:

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

Cache events of the ranks are folded into per-worker, sequenced events
(:mod:`vertumnus.worker.events`); :meth:`Engine.list_blocks` gives the
snapshot that goes with them. Errors the caller can fix raise
:class:`InvalidRequest` or :class:`NotReady`; the engine stays up.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from vertumnus.core.lattice import Slot

from .blocks import Block, block_owner
from .copies import plan_copy
from .dispatch import PrefillOutcome, WorkerRunner
from .errors import InvalidRequest, NotReady, check_tokens
from .events import EventLog, EventStream, served_by
from .kv_cache import CacheEvent
from .lattice import engine_grouping
from .pool import RankPool
from .rank import (
    Command,
    EvictBlocks,
    FlushBlocks,
    ListBlocks,
    QueryBlocks,
    RankSpec,
    ReadBlocks,
    RecvBlocks,
    SendBlocks,
    SetEpoch,
)
from .step import StepRequest

if TYPE_CHECKING:
    import torch

__all__ = [
    "BlockListing",
    "CopyReport",
    "Engine",
    "InvalidRequest",
    "NotReady",
    "SwitchReport",
    "format_grouping",
]


@dataclass(frozen=True)
class CopyReport:
    copied_blocks: int
    skipped_blocks: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class SwitchReport:
    """The outcome of :meth:`Engine.switch_epoch`."""

    epoch: int
    seconds: float  # activating the groups on the ranks (design.md section 5, step 3)
    unchanged: bool  # the epoch and grouping were already in force: nothing was done


@dataclass(frozen=True)
class BlockListing:
    """A worker's blocks at one point of its event stream."""

    worker: int
    epoch: int
    incarnation: int
    sequence: int  # the snapshot reflects every event up to this sequence, none after
    held: dict[int, list[Block]]  # per rank, every block it holds (owned or not)
    served: list[Block]  # what the worker serves: blocks held by their owner rank


def format_grouping(slots: Sequence[Slot]) -> str:
    """``[0: CP2 at rank 0, 2: CP2 at rank 2]``: a grouping as messages show it."""
    return "[" + ", ".join(f"{s.worker}: CP{s.degree} at rank {s.offset}" for s in slots) + "]"


class _Regroupable(Protocol):
    slot: Slot

    @property
    def draining(self) -> bool: ...

    def describe(self) -> str: ...

    def drain(self) -> None: ...

    def resume(self) -> None: ...


_W = TypeVar("_W", bound=_Regroupable)


class WorkerTable(Generic[_W]):
    """The current epoch's workers by id and by rank, and the lookups the gRPC service
    makes: the same in every engine (this one, the SGLang adapter)."""

    world: int
    epoch: int
    workers: dict[int, _W]
    """By worker id."""
    _by_rank: dict[int, _W]
    """Every rank → its worker."""
    _whole = "rank engine"
    """What the ranks are ranks of, for messages (``8-rank engine``)."""

    def grouping(self) -> list[Slot]:
        """The current workers, by first rank."""
        return sorted((w.slot for w in self.workers.values()), key=lambda s: s.offset)

    def worker(self, worker: int) -> _W:
        w = self.workers.get(worker)
        if w is None:
            raise NotReady(
                f"no worker {worker} in epoch {self.epoch}; workers: {format_grouping(self.grouping())}"
            )
        return w

    def worker_at(self, rank: int) -> _W | None:
        """The worker whose first rank is ``rank`` (the one rank ``rank``'s endpoint serves)."""
        w = self._by_rank.get(rank)
        return w if w is not None and w.slot.offset == rank else None

    def worker_of(self, rank: int) -> _W:
        """The worker ``rank`` belongs to in the current epoch."""
        w = self._by_rank.get(rank)
        if w is None:
            raise NotReady(f"rank {rank} is not in this {self.world}-{self._whole}")
        return w

    def drain(self, worker: int) -> None:
        self.worker(worker).drain()

    def resume(self, worker: int) -> None:
        self.worker(worker).resume()


def regroup_plan(
    epoch: int, current_epoch: int, slots: Sequence[Slot], workers: Iterable[_W]
) -> list[_W] | None:
    """The epoch rules of a regroup, shared by every engine: the workers that leave
    the grouping (each must already be draining), or None when ``epoch`` is the one in
    force with this grouping (nothing to do). An older epoch, or the current one with
    another grouping, or a leaving worker still admitting, is refused (NotReady)."""
    pool = list(workers)
    current = sorted((w.slot for w in pool), key=lambda s: s.offset)
    if epoch < current_epoch:
        raise NotReady(f"epoch {epoch} is older than the current epoch {current_epoch}")
    if epoch == current_epoch:
        if set(slots) == set(current):
            return None
        raise NotReady(
            f"epoch {epoch} is already in force with grouping {format_grouping(current)}; "
            f"grouping {format_grouping(slots)} needs a newer epoch"
        )
    changing = [w for w in pool if w.slot not in slots]
    undrained = [w.describe() for w in changing if not w.draining]
    if undrained:
        raise NotReady(f"{', '.join(undrained)} must be drained before epoch {epoch} regroups them")
    return changing


def _incarnation() -> int:
    return secrets.randbits(64) or 1  # 0 means "not given" on the wire


class Engine(WorkerTable[WorkerRunner]):
    """CP workers over a pool of ``world`` rank processes; see the module docstring.

    ``grouping`` is the first epoch's workers: Slots (pool-level ids, domain 0,
    offset = first rank) or degrees left to right (ids = first ranks).
    ``event_buffer`` is how many events per worker are kept for replay.
    """

    def __init__(
        self,
        world: int,
        grouping: Sequence[Slot] | Sequence[int],
        spec: RankSpec | None = None,
        *,
        max_tokens: int = 8192,
        max_batch_tokens: int = 16384,
        event_buffer: int = 4096,
    ) -> None:
        slots = engine_grouping(grouping, world)  # validate before spawning anything
        if event_buffer < 1:
            raise ValueError(f"event_buffer must be >= 1, got {event_buffer}")
        self.spec = spec or RankSpec()
        self.max_tokens, self.max_batch_tokens = max_tokens, max_batch_tokens
        self.event_buffer = event_buffer
        self.incarnation = _incarnation()
        self._control = threading.Lock()  # one epoch switch or copy plan at a time
        self.epoch = 0
        self.workers = {}
        self._by_rank = {}
        self.pool = RankPool(world, self.spec, on_events=self._publish)
        self.world = self.pool.world
        self.vocab_size: int = self.pool.info[0]["vocab_size"]
        self.block_bytes: int = self.pool.info[0]["block_bytes"]
        self.cache_blocks_per_rank: int = self.pool.info[0]["num_blocks"]
        """KV cache slots of each rank (a worker of degree C holds C times this)."""
        try:
            self._activate(1, slots)
        except Exception:
            self.pool.close()
            raise

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @contextmanager
    def _holding(self, *workers: int) -> Iterator[list[WorkerRunner]]:
        """The workers with their step locks held (by first rank: one global order),
        still in the grouping: a regroup that raced us makes this NotReady."""
        runners = [self.worker(w) for w in workers]
        with ExitStack() as stack:
            for w in sorted(runners, key=lambda w: w.slot.offset):
                stack.enter_context(w.step_lock)
            for w in runners:
                if self.workers.get(w.slot.worker) is not w:
                    raise NotReady(f"{w.describe()} left the grouping in epoch {self.epoch}")
            yield runners

    # -- requests --------------------------------------------------------------

    def submit(
        self,
        worker: int,
        request_id: str,
        tokens: Sequence[int],
        *,
        use_cache: bool = True,
        return_hidden: bool = False,
    ) -> Future[PrefillOutcome]:
        tokens = tuple(int(t) for t in tokens)
        check_tokens(request_id, tokens, self.max_tokens, self.vocab_size)
        opts = {"use_cache": use_cache, "return_hidden": return_hidden}
        return self.worker(worker).submit(StepRequest(request_id, tokens), opts)

    def prefill(
        self,
        worker: int,
        request_id: str,
        tokens: Sequence[int],
        *,
        use_cache: bool = True,
        return_hidden: bool = False,
    ) -> PrefillOutcome:
        return self.submit(
            worker, request_id, tokens, use_cache=use_cache, return_hidden=return_hidden
        ).result()

    # -- regrouping ----------------------------------------------------------------

    def switch_epoch(self, epoch: int, grouping: Sequence[Slot] | Sequence[int]) -> SwitchReport:
        """Commit ``grouping`` (Slots, or degrees with default ids) under ``epoch``.

        A worker with the same id, offset and degree as now is kept and keeps
        serving; every other current worker must have been drained (design.md
        section 5, step 1). An older epoch is refused; the current epoch again
        succeeds without doing anything if its grouping is the one in force (a
        controller resuming after a restart) and is refused otherwise.
        """
        slots = engine_grouping(grouping, self.world)
        with self._control:
            changing = regroup_plan(epoch, self.epoch, slots, self.workers.values())
            if changing is None:
                return SwitchReport(epoch, 0.0, unchanged=True)
            for w in changing:
                w.drain()
            return SwitchReport(epoch, self._activate(epoch, slots), unchanged=False)

    def _activate(self, epoch: int, slots: list[Slot]) -> float:
        keep = {s for s in slots if s.worker in self.workers and self.workers[s.worker].slot == s}
        leaving = sorted(
            (w for w in self.workers.values() if w.slot not in keep), key=lambda w: w.slot.offset
        )
        new = [s for s in slots if s not in keep]
        held: dict[int, list[Block]] = {}
        for w in leaving:
            w.step_lock.acquire()  # park: no step may start on these ranks
        try:
            started = time.perf_counter()
            self.pool.call({r: SetEpoch(epoch, s) for s in new for r in s.ranks})
            seconds = time.perf_counter() - started
            if self.workers:  # what the new workers serve already (nothing at start)
                held = self.pool.call({r: ListBlocks() for s in new for r in s.ranks})
        finally:
            for w in leaving:
                w.step_lock.release()
        for w in leaving:
            w.stop()
            w.events.close(f"{w.describe()} left the grouping in epoch {epoch}")
            del self.workers[w.slot.worker]
        for s in new:
            log = EventLog(s, self.incarnation, epoch, self.event_buffer)
            for r in s.ranks:
                served = sorted(served_by(s, r, held.get(r, [])), key=lambda b: (b.position, b.key))
                if served:
                    log.publish("stored", served, r, epoch)
            self.workers[s.worker] = WorkerRunner(self.pool, s, epoch, self.max_batch_tokens, log)
        self._by_rank = {r: w for w in self.workers.values() for r in w.slot.ranks}
        self.epoch = epoch
        for s in keep:  # the commit makes every worker of the new grouping schedulable
            self.workers[s.worker].epoch = epoch
            self.workers[s.worker].resume()
        return seconds

    # -- blocks ------------------------------------------------------------------

    def copy_blocks(self, source: int, destination: int, keys: Sequence[int]) -> CopyReport:
        """Copy the prefix ``keys`` (chained keys, root first) from worker ``source`` to
        ``destination``, re-partitioned to the destination's geometry; only blocks the
        destination lacks move. Refuses, copying nothing, if the source lacks any of them.
        ``source == destination`` moves blocks between the worker's own ranks, to their
        owners under its geometry (the reconciliation after a merge)."""
        keys = tuple(int(k) for k in keys)
        if not keys:
            raise InvalidRequest("copy: block_keys is empty")
        # source == destination re-partitions within one worker: after a merge, a
        # block one of the halves held sits on ranks that no longer own it.
        workers = (source,) if source == destination else (source, destination)
        with self._control, self._holding(*workers) as runners:
            src, dst = runners[0], runners[-1]
            ranks = sorted({*src.slot.ranks, *dst.slot.ranks})
            holders = self.pool.call({r: QueryBlocks(keys) for r in ranks})
            plan = plan_copy(keys, holders, src.slot, dst.slot)
            if plan.missing:
                j, key = plan.missing[0]
                raise NotReady(
                    f"copy: source worker {source} lacks {len(plan.missing)} of the {len(keys)} requested blocks "
                    f"(first at position {j}, key {key:#018x}); nothing copied"
                )
            started = time.perf_counter()
            cmds: dict[int, Command] = {
                r: SendBlocks({d: tuple(ks) for d, ks in m.items()}) for r, m in plan.sends.items()
            }
            cmds.update(
                {
                    r: RecvBlocks({s: tuple(bs) for s, bs in m.items()})
                    for r, m in plan.receives.items()
                }
            )
            answers = self.pool.call(cmds) if cmds else {}
            seconds = time.perf_counter() - started
        copied = sum(answers[r] for r in plan.receives)
        return CopyReport(copied, plan.skipped, copied * self.block_bytes, seconds)

    def read_blocks(self, worker: int, keys: Sequence[int]) -> dict[int, torch.Tensor]:
        """The bytes of ``keys`` as held by each block's owner rank (tests, round trips)."""
        with self._holding(worker) as (w,):
            answers = self.pool.call({r: ReadBlocks(tuple(keys)) for r in w.slot.ranks})
        out = {}
        for j, key in enumerate(keys):
            owner = w.slot.offset + block_owner(j, w.slot.degree)
            if key in answers[owner]:
                out[key] = answers[owner][key]
        return out

    def list_blocks(self, worker: int) -> BlockListing:
        """What each rank holds and what the worker serves, at a known event sequence."""
        with self._holding(worker) as (w,):
            held: dict[int, list[Block]] = self.pool.call({r: ListBlocks() for r in w.slot.ranks})
            sequence = w.events.last_sequence  # no event of w can be published while we hold it
            epoch = self.epoch
        served = sorted(
            (b for r, blocks in held.items() for b in served_by(w.slot, r, blocks)),
            key=lambda b: (b.position, b.key),
        )
        return BlockListing(
            w.slot.worker, epoch, self.incarnation, sequence, dict(sorted(held.items())), served
        )

    def evict_blocks(self, worker: int, keys: Sequence[int]) -> int:
        """Reclaim: drop ``keys`` from every rank of the worker; returns blocks removed."""
        with self._holding(worker) as (w,):
            answers = self.pool.call({r: EvictBlocks(tuple(keys)) for r in w.slot.ranks})
        return sum(len(v) for v in answers.values())

    def flush_cache(self, worker: int) -> int:
        """Drop every block the worker's ranks hold and publish one ``cleared`` event;
        returns the blocks removed (over all its ranks, served or not)."""
        with self._holding(worker) as (w,):
            answers = self.pool.call({r: FlushBlocks() for r in w.slot.ranks})
            w.events.publish("cleared", [], w.slot.offset, self.epoch)
        return sum(answers.values())

    # -- events --------------------------------------------------------------------

    def subscribe(
        self, worker: int, from_sequence: int = 0, *, incarnation: int = 0, epoch: int = 0
    ) -> EventStream:
        """The worker's events after ``from_sequence`` (replayed, then live), or a
        ``resync`` event first when that history is not available; see
        :meth:`vertumnus.worker.events.EventLog.subscribe`."""
        return self.worker(worker).events.subscribe(
            from_sequence, incarnation=incarnation, epoch=epoch, current_epoch=self.epoch
        )

    def _publish(self, rank: int, events: list[CacheEvent]) -> None:
        """Fold one rank's cache events into its worker's events (see events.py)."""
        w = self._by_rank.get(rank)
        if w is None:
            return
        for e in events:
            if e.kind == "cleared":
                continue  # flush_cache publishes one for the whole worker
            served = served_by(w.slot, rank, e.blocks)
            if served:
                w.events.publish(e.kind, served, rank, self.epoch)

    def close(self) -> None:
        for w in list(self.workers.values()):
            w.stop()
            w.events.close(f"{w.describe()}: the engine stopped")
        self.pool.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
