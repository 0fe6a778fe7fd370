"""The routing core: one pool's placement bookkeeping, as steps the simulator and the router both run.

This is the step protocol of design.md section 3 (and of vLLM's scheduler:
``schedule`` returns a decision, the shell carries it out, and the shell's
reports are folded back in). A shell — the simulator's event loop, the gRPC
router — calls, for every request:

1. :meth:`RoutingCore.schedule` on arrival (or to place a request again): q_w
   of every worker is refreshed at the shell's ``now``, the policy decides,
   Ê is **reserved** at the chosen worker at once, the request's prefix is
   recorded as in flight there, and the policy and the cache manager are
   told (``observe_placed``, ``observe_request``). The decision says where to
   send the request and, in ``copies``, which pending blocks of a recent
   split or merge must be copied there first (:mod:`vertumnus.core.reconcile`);
2. :meth:`RoutingCore.started` when the worker starts its prefill (the shell
   says until when it expects it to run: the simulator knows, the router
   uses Ê);
3. :meth:`RoutingCore.finished` when the prefill is done, or
   :meth:`RoutingCore.failed` when the worker lost it (the shell places it
   again with ``schedule``), or :meth:`RoutingCore.withdraw` when a drain
   takes a worker's queued requests back to place them elsewhere;
4. :meth:`RoutingCore.apply_cache_events` whenever a worker reports blocks
   stored or removed: the global prefix index (a
   :class:`~vertumnus.core.store.TrieStore`) changes only here.

The core reads no clock and does no I/O: ``now`` is whatever time the shell
lives in. It holds the pool's :class:`~vertumnus.core.placement.WorkerState`
list (the policy's view of q_w, queue lengths, availability) and implements
:class:`~vertumnus.core.policies.base.PoolView` for the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.inflight import InflightPrefixes
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import Policy
from vertumnus.core.reconcile import PendingCopy
from vertumnus.core.store import StoredBlock, TrieStore
from vertumnus.core.trie import PrefixTrie
from vertumnus.core.types import Request

if TYPE_CHECKING:
    from vertumnus.core.cachemanager import CacheManager

__all__ = ["Invalidation", "Removal", "RoutingCore", "placement_order"]


@dataclass(frozen=True, slots=True)
class Invalidation:
    """Blocks that ``worker`` can no longer serve: their reconciliation source left
    the pool before they were copied. The shell deletes them at the worker (the
    simulator from its cache; a real worker never had them complete) and reports
    the removal like any other cache event."""

    worker: int
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Removal:
    """What a worker's leaving the pool undoes elsewhere."""

    invalidations: tuple[Invalidation, ...] = ()
    dropped_operations: tuple[object, ...] = ()
    """Cache-manager copies and reclamations that involved the worker: abandoned
    (a late report of one of them is ignored by the manager's bookkeeping)."""


@dataclass(slots=True)
class _Load:
    """The core's own bookkeeping of one worker, behind its WorkerState."""

    state: WorkerState
    queued_estimate_s: float = 0.0
    """Σ Ê of the requests placed here and not started; q_w = this + the rest of
    the running prefill."""
    running: int | None = None
    """Id of the request being prefilled, if any; ``state.free_at`` is when the shell
    expects it to end."""
    external_s: float = 0.0
    """Work other router replicas have placed here (shared through the store):
    added to q_w so that two replicas do not pile onto one worker."""
    pending: dict[int, int] = field(default_factory=dict)
    """Cached block key → worker whose ranks hold the rest of its KV (this
    worker's own id: its own ranks), for blocks a reconfiguration left to
    reconcile (:mod:`vertumnus.core.reconcile`)."""


def _unqueue(load: _Load, estimate_s: float) -> None:
    """A request of Ê ``estimate_s`` leaves ``load``'s queue (it starts, or it failed).

    An empty queue holds no work, exactly: the running sum of Ê added and
    subtracted leaves a rounding residue (up to 5e-16 s measured), and an idle
    worker with one counted as busy to placement's tie-break (``outstanding_s``
    > 0) and had its cost moved by an ulp, so ties among idle workers went to
    whichever had no residue rather than to the longest idle."""
    load.state.queued -= 1
    load.queued_estimate_s = load.queued_estimate_s - estimate_s if load.state.queued else 0.0


@dataclass(slots=True)
class _Placed:
    request: Request
    decision: RouteDecision
    started: bool = False
    forwarded: bool = False


class RoutingCore:
    """Placement bookkeeping of one pool (see the module docstring).

    ``cache_manager`` (optional) learns from every placement and completion;
    its scans are run by the shell (:meth:`CacheManager.scan` with this core
    as the view).
    """

    def __init__(
        self,
        policy: Policy,
        model: PrefillModel,
        block_size: int,
        *,
        store: TrieStore | None = None,
        cache_manager: CacheManager | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self.policy = policy
        self._model = model
        self._block_size = block_size
        self._store: TrieStore = store if store is not None else PrefixTrie()
        self.cache_manager = cache_manager
        self.inflight = InflightPrefixes()
        self._states: list[WorkerState] = []
        self._loads: dict[int, _Load] = {}
        self._placed: dict[int, _Placed] = {}

    # -- PoolView ---------------------------------------------------------------

    @property
    def workers(self) -> Sequence[WorkerState]:
        return self._states

    @property
    def model(self) -> PrefillModel:
        return self._model

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def store(self) -> TrieStore:
        return self._store

    def worker(self, worker_id: int) -> WorkerState:
        try:
            return self._loads[worker_id].state
        except KeyError:
            raise KeyError(f"worker {worker_id} is not in the pool") from None

    def matched_blocks(self, request: Request) -> Mapping[int, int]:
        return self._store.matched_blocks(request.block_keys)

    def inflight_blocks(self, request: Request) -> Mapping[int, int]:
        return self.inflight.matched_blocks(request.block_keys)

    # -- membership -----------------------------------------------------------------

    def add_worker(
        self, worker_id: int, degree: int, cache_capacity_blocks: int = 0
    ) -> WorkerState:
        """A worker joins the pool (available at once; see :meth:`set_available`)."""
        if worker_id in self._loads:
            raise ValueError(f"worker {worker_id} is already in the pool")
        if degree < 1:
            raise ValueError(f"worker {worker_id}: degree must be >= 1, got {degree}")
        state = WorkerState(
            id=worker_id, degree=degree, cache_capacity_blocks=cache_capacity_blocks
        )
        self._loads[worker_id] = _Load(state)
        self._states.append(state)
        return state

    def remove_workers(self, worker_ids: Sequence[int]) -> Removal:
        """Idle workers leave the pool (together: the participants of one commit);
        their blocks leave the index.

        Returns the blocks the remaining workers can no longer reconcile (their
        copy source left; the shell deletes them there) and the cache manager's
        operations that were abandoned.
        """
        gone = set(worker_ids)
        for wid in worker_ids:
            load = self._loads.get(wid)
            if load is None:
                raise KeyError(f"worker {wid} is not in the pool")
            if load.running is not None or load.state.queued:
                raise RuntimeError(f"worker {wid} still has work; drain it first")
        for wid in worker_ids:
            load = self._loads.pop(wid)
            self._states.remove(load.state)
            self._store.drop_worker(wid)
        dropped: tuple[object, ...] = ()
        if self.cache_manager is not None:
            dropped = tuple(self.cache_manager.workers_removed(list(worker_ids)))
        out = []
        for other in self._loads.values():
            if not other.pending:
                continue
            lost = [k for k, src in other.pending.items() if src in gone]
            if lost:
                for k in lost:
                    del other.pending[k]
                out.append(Invalidation(other.state.id, tuple(lost)))
        return Removal(tuple(out), dropped)

    def set_available(self, worker_ids: Iterable[int], available: bool) -> None:
        """Take workers out of the candidate set (draining, parked) or put them back."""
        for w in worker_ids:
            self.worker(w).available = available

    def set_pending(self, worker_id: int, pending: Mapping[int, int]) -> None:
        """Blocks of ``worker_id`` to reconcile before reuse, and where from (key → source)."""
        self._loads[worker_id].pending = dict(pending)

    def pending(self, worker_id: int) -> Mapping[int, int]:
        return self._loads[worker_id].pending

    def running_remaining(self, now: float) -> dict[int, float]:
        """Per worker, the seconds its running prefill is still expected to take (0 if
        idle): what the composition controller ranks drains by."""
        return {
            w: max(0.0, load.state.free_at - now) if load.running is not None else 0.0
            for w, load in self._loads.items()
        }

    def idle(self, worker_id: int) -> bool:
        """Nothing placed at the worker is queued or running."""
        load = self._loads[worker_id]
        return load.running is None and not load.state.queued

    # -- the step protocol -----------------------------------------------------------

    def refresh(self, now: float) -> None:
        """q_w = queued Ê + the running prefill's remaining time (+ other replicas'
        work there), at ``now``."""
        for load in self._loads.values():
            until = load.state.free_at
            rest = until - now if load.running is not None and until > now else 0.0
            load.state.outstanding_s = load.queued_estimate_s + rest
            if load.external_s:
                load.state.outstanding_s += load.external_s

    def own_outstanding(self, now: float) -> dict[int, float]:
        """Per worker, the work this core placed there and not finished (what a router
        replica shares with the others)."""
        out = {}
        for w, load in self._loads.items():
            until = load.state.free_at
            rest = until - now if load.running is not None and until > now else 0.0
            # An emptied queue holds exactly 0 (_unqueue); a queue still holding
            # requests sums positive estimates, less a residue far smaller than
            # them. The guard keeps what is shared >= 0 even so.
            out[w] = max(0.0, load.queued_estimate_s) + rest
        return out

    def set_external_load(self, seconds: Mapping[int, float]) -> None:
        """Work other replicas placed at each worker (absent: none); counted in q_w."""
        for w, load in self._loads.items():
            load.external_s = float(seconds.get(w, 0.0))

    def schedule(self, request: Request, now: float) -> RouteDecision | None:
        """Place ``request``: decide, reserve, record. None if no worker can take it now."""
        if request.id in self._placed:
            raise ValueError(f"request {request.id} is already placed; withdraw or fail it first")
        self.refresh(now)
        decision = self.policy.decide(request, self)
        if decision is None:
            return None
        load = self._loads.get(decision.worker)
        if load is None or not load.state.available:
            raise RuntimeError(
                f"policy {self.policy.name} chose worker {decision.worker}, which is not available"
            )
        if load.pending:
            copies = self._reconcile(request, load)
            if copies:
                decision = decision._replace(copies=copies)
        est = decision.estimate_s
        load.queued_estimate_s += est
        state = load.state
        state.queued += 1
        state.outstanding_s += est
        self._placed[request.id] = _Placed(request, decision)
        self.inflight.add(request.id, decision.worker, request.block_keys)
        self.policy.observe_placed(request, decision, self)
        if self.cache_manager is not None:
            self.cache_manager.observe_request(request, decision, self)
        return decision

    def _reconcile(self, request: Request, load: _Load) -> tuple[PendingCopy, ...]:
        """The copies of pending blocks this placement reuses (design.md section 5:
        a pending prefix is copied, missing blocks only, on first reuse)."""
        worker = load.state.id
        held = self._store.matched_blocks(request.block_keys).get(worker, 0)
        keys = request.block_keys[:held]
        by_source: dict[int, list[int]] = {}
        pending = load.pending
        for k in keys:
            src = pending.pop(k, None)
            if src is not None:
                by_source.setdefault(src, []).append(k)
        return tuple(
            PendingCopy(worker, src, keys, tuple(blocks))
            for src, blocks in sorted(by_source.items())
        )

    def started(self, request_id: int, now: float, until: float) -> None:
        """The worker started prefilling ``request_id`` and expects to end at ``until``."""
        placed = self._placed[request_id]
        if placed.started:
            raise ValueError(f"request {request_id} was already started")
        load = self._loads[placed.decision.worker]
        if load.running is not None:
            raise RuntimeError(
                f"worker {placed.decision.worker} starts request {request_id} while "
                f"{load.running} is still running"
            )
        placed.started = True
        _unqueue(load, placed.decision.estimate_s)
        load.state.running = 1
        load.running = request_id
        load.state.free_at = until

    def finished(self, request_id: int) -> RouteDecision:
        """The prefill of ``request_id`` is done; returns its decision."""
        placed = self._placed.pop(request_id)
        self._release(placed)
        return placed.decision

    def failed(self, request_id: int) -> Request:
        """The worker lost ``request_id`` (connection, deadline, crash): its reservation
        is released and the request is returned, for the shell to place again."""
        placed = self._placed.pop(request_id)
        if not placed.started:
            _unqueue(self._loads[placed.decision.worker], placed.decision.estimate_s)
        self._release(placed)
        return placed.request

    def forwarded(self, request_id: int) -> None:
        """The shell handed queued ``request_id`` to its worker ahead of time, to wait
        there behind the running one (so the worker never idles for a round trip): it
        is still queued and starts when the worker gets to it, but a drain can no
        longer take it back."""
        placed = self._placed[request_id]
        if placed.started:
            raise ValueError(f"request {request_id} has already started")
        placed.forwarded = True

    def withdraw(self, worker_id: int, request_ids: Sequence[int]) -> list[Request]:
        """A drain takes every queued request back from ``worker_id`` (``request_ids``,
        in queue order; not the ones :meth:`forwarded` to it), for the shell to place
        again; their reservations are released."""
        return self.withdraw_queues({worker_id: request_ids})

    def withdraw_queues(self, queues: Mapping[int, Sequence[int]]) -> list[Request]:
        """:meth:`withdraw` at several workers at once (worker → its queued ids, in
        queue order); the requests come back in queue order, worker by worker.

        Where new workers joined (a commit), the shell takes back the whole pool's
        queues this way and places them again oldest first
        (:func:`placement_order`): the queues built while the old layout was short
        of capacity — the drained workers' queues went to the others — spread
        over the new workers instead of waiting behind the old ones.
        """
        named = {w: list(ids) for w, ids in queues.items()}
        queued: dict[int, set[int]] = {w: set() for w in named}
        for rid, p in self._placed.items():
            mine = queued.get(p.decision.worker)
            if mine is not None and not p.started and not p.forwarded:
                mine.add(rid)
        for w, ids in named.items():
            if set(ids) != queued[w] or len(ids) != len(queued[w]):
                raise ValueError(
                    f"withdraw({w}) must name every queued request there once: "
                    f"queued {sorted(queued[w])}, got {ids}"
                )
        out = []
        for ids in named.values():
            for rid in ids:
                placed = self._placed.pop(rid)
                self._forget(placed)
                out.append(placed.request)
        # Recount what stays queued (the forwarded ones) rather than subtract, so no
        # rounding residue is left behind.
        for w in named:
            self._loads[w].queued_estimate_s = 0.0
            self._loads[w].state.queued = 0
        for p in self._placed.values():
            if p.decision.worker in named and not p.started:
                staying = self._loads[p.decision.worker]
                staying.queued_estimate_s += p.decision.estimate_s
                staying.state.queued += 1
        return out

    def _release(self, placed: _Placed) -> None:
        load = self._loads.get(placed.decision.worker)
        if load is not None and load.running == placed.request.id:
            load.running = None
            load.state.running = 0
        self._forget(placed)

    def _forget(self, placed: _Placed) -> None:
        rid = placed.request.id
        self.inflight.remove(rid)
        self.policy.observe_completed(placed.request, placed.decision.worker)
        if self.cache_manager is not None:
            self.cache_manager.request_done(rid)

    def decision(self, request_id: int) -> RouteDecision | None:
        """The decision of a placed, unfinished request (None if unknown)."""
        placed = self._placed.get(request_id)
        return placed.decision if placed is not None else None

    def placed_requests(self, worker_id: int | None = None) -> list[Request]:
        """Requests placed and not finished (at ``worker_id``, or anywhere)."""
        return [
            p.request
            for p in self._placed.values()
            if worker_id is None or p.decision.worker == worker_id
        ]

    # -- cache events -------------------------------------------------------------------

    def apply_cache_events(
        self,
        worker_id: int,
        stored: Sequence[StoredBlock | tuple[int, int, int | None]] = (),
        removed: Sequence[int] = (),
        *,
        cleared: bool = False,
        used_blocks: int | None = None,
    ) -> int:
        """Fold one batch of ``worker_id``'s cache events into the index; the new cursor.

        ``used_blocks``: the worker's cache occupancy now, if the shell knows it.
        Removed blocks stop being pending there.
        """
        cursor = self._store.apply(worker_id, stored, removed, cleared=cleared)
        load = self._loads.get(worker_id)
        if load is not None:
            if used_blocks is not None:
                load.state.cache_used_blocks = used_blocks
            if load.pending:
                if cleared:
                    load.pending.clear()
                for key in removed:
                    load.pending.pop(key, None)
        return cursor


def placement_order(requests: Iterable[Request]) -> list[Request]:
    """The order in which requests taken back from several queues are placed again:
    oldest arrival first (ties by id), as they would have been placed had the
    pool been this one when they arrived."""
    return sorted(requests, key=lambda r: (r.arrival_s, r.id))
