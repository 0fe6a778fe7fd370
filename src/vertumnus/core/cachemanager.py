"""The global prefix-cache manager (design.md section 6): a planner, no I/O.

Workers cache prefixes locally (:mod:`vertumnus.core.blockcache`); the global
prefix index, a :class:`~vertumnus.core.store.TrieStore`, says who holds
what. This module decides, from how requests actually use those prefixes,
where to **copy** a prefix (so more placement choices keep their cache hit)
and which redundant copies to **reclaim**. It never moves a byte:
:meth:`CacheManager.scan` returns a :class:`ScanPlan`, a shell carries it out
and reports back with :meth:`CacheManager.copy_finished` /
:meth:`CacheManager.reclaim_finished`. This is the planner/executor split of
``docs/style.md``.

Vocabulary, per block z of the index (the root→z path is the prefix):

- ``ReplicaCount(z, C)``: degree-C workers among z's holders.
- ``access[z, C]``: decaying count of requests at degree-C workers that reused z.
- ``missed[z, C]``: decaying sum of predicted service seconds lost by requests
  that *preferred* degree C (C_pref, design.md section 3) while no degree-C
  worker held z. Each block carries only the **marginal** benefit of its own
  block (reuse ending at z versus at its parent), so a long prefix is not
  counted once per ancestor.

Counters belong to one incarnation of a block (its key and generation): a
block that leaves the index and comes back starts from zero.

Per request (:meth:`CacheManager.observe_request`): ``access`` on the reused
path at the chosen worker, ``missed`` on the part of the matched path that no
C_pref worker holds.

Per scan (:meth:`CacheManager.scan`), for every tracked (z, C), r = ReplicaCount:

- r = 0 and missed > θ_inter → **inter-degree** replication (first copy at C),
  ranked by missed per copied block;
- r > 0 and access > r·θ_intra → **intra-degree** replication (one more copy
  at C), ranked by access/r, smaller copy footprint first among near-ties;
- r > 0 and access < r·θ_reclaim → **reclamation**, ranked by increasing
  access/r, deeper blocks first on ties (a path is reclaimed leaf first, and
  one scan may take a leaf and then its parent); by default only when
  r ≥ 2 (``reclaim_min_replicas``);
- each list is cut to a per-scan bound, then every counter is multiplied by
  ``decay``.


**Why the scan is cheap** (``bench/cache_scan.py``: < 50 ms with 200,000
live blocks). The scan visits only the *tracked* blocks — those whose
counters are still above ``counter_floor`` — and forgets the rest, so its
cost follows recent traffic, not the index size. A block that dropped out
has counters that are negligible against every threshold, so it could only
have been a reclamation candidate; such cold replicas are left to the
workers' own LRU eviction, which removes exactly those first.

The work is split by job:

- :mod:`vertumnus.core.cachesettings`: the settings, shared by the others;
- :mod:`vertumnus.core.cachecounters`: the counters (a table read with
  NumPy; lazy decay of untracked blocks; following the store's change
  cursor);
- :mod:`vertumnus.core.cacheranking`: the three ranked lists, computed only
  as far as the selection reads them (exactly the head a full sort gives,
  ``tests/cachemanager/test_scan_reference.py``);
- this module: requests, the selection of bounded operations and the
  bookkeeping of operations in flight.

**Safety rules the plan obeys.**

- A copy carries the whole root→z path but only the destination's missing
  blocks are transferred (``Copy.missing_blocks``); its modeled transfer time
  is ``latency + missing·block_size·kv_bytes_per_token / (link_bandwidth ·
  min(C_src, C_dst))`` — every rank of the narrower side moves its share in
  parallel, and an inter-degree copy is re-partitioned for the destination
  geometry on the way.
- A copy is not a holder until the shell reports it installed (the index only
  learns of it from the destination's cache events), so placement never
  counts on a replica still in flight. One copy per (z, C) is in flight at a
  time.
- A reclamation removes one block z at one worker, and only when that worker
  holds no child of z (removing z would strand every retained descendant,
  since block keys are chained) and no queued or running request placed there
  reuses z (*in use*: tracked by pins from :meth:`observe_request` until
  :meth:`request_done`). A degree's last copy is left to LRU by default, and
  by default blocks are reclaimed only at workers that incoming copies will
  fill beyond their free space (``reclaim_for_room_only``). A
  reclaimed block stays in the metadata until the shell confirms the
  deletion; the shell re-checks the rules then, because requests may have
  arrived in between.

Everything here is a pure function of explicit state: no clock, no I/O, no
module-level state. The index is read only through the
:class:`~vertumnus.core.store.TrieStore` protocol; the block records it
returns are kept for one scan or one request at most.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Literal

from vertumnus.core.cachecounters import CounterTable, TrackedBlock, TrackedBlocks
from vertumnus.core.cacheranking import Candidate, RankedLists, Ranking
from vertumnus.core.cachesettings import CacheManagerSettings
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.decision import RouteDecision
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import PoolView
from vertumnus.core.store import BlockInfo, TrieStore
from vertumnus.core.types import Request, cached_tokens

__all__ = [
    "CacheManager",
    "CacheManagerSettings",
    "CacheView",
    "Candidate",
    "Copy",
    "RankedLists",
    "Reclaim",
    "ScanPlan",
    "TrackedBlock",
    "marginal_benefits",
    "replica_count",
]

CacheView = PoolView
"""What the manager reads: a policy's view of the pool (workers, model, block
size and the prefix index, ``store``)."""


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy the prefix ending at ``key`` to ``destination``."""

    kind: Literal["inter", "intra"]
    key: int
    degree: int
    source: int
    destination: int
    keys: tuple[int, ...]
    """The whole root→z path, root first (the destination keeps what it has)."""
    missing_blocks: int
    """Blocks actually transferred."""
    transfer_s: float


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Delete block ``key`` (a leaf of ``worker``'s cached prefixes) at ``worker``."""

    key: int
    degree: int
    worker: int


@dataclass(slots=True)
class ScanPlan:
    """What one scan decided: ranked candidates (for inspection) and operations."""

    epoch: int
    inter: list[Candidate] = field(default_factory=list)
    intra: list[Candidate] = field(default_factory=list)
    reclaim: list[Candidate] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    reclaims: list[Reclaim] = field(default_factory=list)
    tracked_nodes: int = 0
    """Blocks tracked after the scan (counters above the floor)."""

    def __bool__(self) -> bool:
        return bool(self.copies or self.reclaims)


def replica_count(holders: Iterable[int], degree: int, degree_of: Mapping[int, int]) -> int:
    """ReplicaCount(z, C): the ``holders`` of z that are degree-C workers in ``degree_of``."""
    return sum(1 for h in holders if degree_of.get(h) == degree)


def marginal_benefits(
    model: PrefillModel, degree: int, length: int, block_size: int, first: int, last: int
) -> list[float]:
    """Marginal benefit of blocks ``first+1 .. last`` (1-based depths) at ``degree``.

    Entry k is E_C with reuse ending at depth k−1 minus E_C with reuse ending
    at depth k, for a request of ``length`` tokens: the service seconds one
    more cached block saves.
    """
    out = []
    p_prev = cached_tokens(first, length, block_size)
    e_prev = model.predict(degree, length - p_prev, p_prev)
    for k in range(first + 1, last + 1):
        p = cached_tokens(k, length, block_size)
        e = model.predict(degree, length - p, p)
        out.append(e_prev - e)
        e_prev = e
    return out


class _Pool:
    """The pool as one selection sees it: available workers and the index."""

    __slots__ = ("by_id", "by_degree", "store", "_settings", "_block_bytes")

    def __init__(self, view: CacheView, settings: CacheManagerSettings) -> None:
        workers = [w for w in view.workers if w.available]
        self.by_id = {w.id: w for w in workers}
        self.by_degree: dict[int, list[WorkerState]] = {}
        for w in workers:
            self.by_degree.setdefault(w.degree, []).append(w)
        self.store: TrieStore = view.store
        self._settings = settings
        self._block_bytes = view.block_size * settings.kv_bytes_per_token

    def transfer_s(self, missing: int, src: WorkerState, dst: WorkerState) -> float:
        """Modeled time of a copy of ``missing`` blocks from ``src`` to ``dst``."""
        s = self._settings
        bw = s.link_bandwidth_bytes_per_s * min(src.degree, dst.degree)
        return s.transfer_latency_s + missing * self._block_bytes / bw

    def path(self, block: BlockInfo) -> list[BlockInfo]:
        """The root→z path of ``block``, root first, by its ``parent`` keys."""
        out = []
        n: BlockInfo | None = block
        while n is not None:
            out.append(n)
            n = self.store.block(n.parent)
        out.reverse()
        return out


class CacheManager:
    """Counters, pins and in-flight operations of the global prefix-cache manager.

    The routing core calls :meth:`observe_request` after each placement,
    :meth:`request_done` when a request finished or left its worker and
    :meth:`workers_removed` when workers leave the pool; the shell calls
    :meth:`scan` every ``scan_interval_s`` and :meth:`copy_finished` /
    :meth:`reclaim_finished` when a worker reports an operation done.

    ``store`` is the prefix index the manager serves; without it, the first
    view the manager sees sets it (a view over another store later drops
    every counter kept so far). :meth:`record` and :meth:`counters` name
    blocks by key in that store. ``first_batch`` is a test and tuning knob of
    the ranking (:class:`~vertumnus.core.cacheranking.Ranking`): the first
    batch size of every candidate list instead of the ones derived from the
    per-scan bounds; the plans are the same whatever it is.
    """

    def __init__(
        self,
        settings: CacheManagerSettings | None = None,
        *,
        store: TrieStore | None = None,
        first_batch: int | None = None,
    ) -> None:
        if first_batch is not None and first_batch < 1:
            raise ValueError(f"first_batch must be >= 1, got {first_batch}")
        self.settings = settings or CacheManagerSettings()
        self._first_batch = first_batch
        self._counters = CounterTable(self.settings.decay)
        if store is not None:
            self._counters.follow(store)
        self._pins: dict[tuple[int, int], int] = {}
        """Requests reusing each (worker, key), queued or running."""
        self._pins_by_request: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._copying: dict[tuple[int, int], Copy] = {}
        """In-flight copies by (key, degree)."""
        self._copy_dest: set[tuple[int, int]] = set()
        """(key, destination) of in-flight copies."""
        self._covered: dict[tuple[int, int], int] = {}
        """(key, degree) of every block on an in-flight copy's path, with a count:
        an ancestor of a prefix being copied needs no copy of its own."""
        self._reclaiming: dict[tuple[int, int], Reclaim] = {}
        """In-flight reclamations by (key, worker)."""
        self._reclaiming_at: dict[int, int] = {}
        """In-flight reclamations per worker (blocks about to be freed)."""
        self.counts: dict[str, int] = {
            "scans": 0,
            "inter_started": 0,
            "intra_started": 0,
            "copies_installed": 0,
            "copies_failed": 0,
            "blocks_copied": 0,
            "reclaims_started": 0,
            "reclaims_done": 0,
            "reclaims_aborted": 0,
        }

    @property
    def epoch(self) -> int:
        """Scans completed; counters decay once per epoch."""
        return self._counters.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._counters.epoch = value

    @property
    def tracked(self) -> Mapping[int, TrackedBlock]:
        """Blocks whose counters may be above the floor, by key, each with its
        generation, depth and counters as of now (read-only)."""
        return TrackedBlocks(self._counters)

    @property
    def covered(self) -> Set[tuple[int, int]]:
        """(key, degree) of every block on the path of a copy in flight (read-only)."""
        return self._covered.keys()

    @property
    def copy_destinations(self) -> Set[tuple[int, int]]:
        """(key, destination worker) of every copy in flight."""
        return frozenset(self._copy_dest)

    @property
    def copies_in_flight(self) -> list[Copy]:
        return list(self._copying.values())

    @property
    def reclaims_in_flight(self) -> list[Reclaim]:
        return list(self._reclaiming.values())

    # -- counters ---------------------------------------------------------------

    def record(self, key: int, degree: int, access: float = 0.0, missed: float = 0.0) -> None:
        """Add ``access`` to access[z, C] and ``missed`` to missed[z, C], z the
        block ``key`` of the store served (KeyError if it is not there)."""
        self._counters.record(key, degree, access, missed)

    def counters(self, key: int) -> tuple[dict[int, float], dict[int, float]]:
        """(access, missed) per degree as of now of the block ``key`` (for tests
        and tools; empty for a block never counted or not in the index)."""
        return self._counters.counters(key)

    # -- requests ---------------------------------------------------------------

    def observe_request(self, request: Request, decision: RouteDecision, view: CacheView) -> None:
        """Fold one placement into the counters and pin its reused path.

        MatchedPath(i) is read from ``view.store``; ``decision.worker`` is the
        chosen worker, ``decision.preferred_degree`` C_pref(i) (0: unknown,
        nothing is missed).
        """
        store = view.store
        self._counters.follow(store)
        path = store.path(request.block_keys)
        worker, preferred_degree = decision.worker, decision.preferred_degree
        degree_of = {w.id: w.degree for w in view.workers}
        degree_w = degree_of.get(worker, 0)
        # ReusedPath(i, w): the matched path down to the deepest block the
        # worker holds; it ends at the first block nobody holds.
        reused = 0
        pref_depth = 0
        for block in path:
            holders = block.holders
            if not holders:
                break
            if worker in holders:
                reused = block.depth
            if preferred_degree and any(degree_of.get(h) == preferred_degree for h in holders):
                pref_depth = block.depth
        if reused:
            self._counters.add_path(path[:reused], degree_w, None, missed=False)
        if preferred_degree and pref_depth < len(path):
            # Blocks deeper than pref_depth have ReplicaCount(z, C_pref) = 0.
            benefits = marginal_benefits(
                view.model, preferred_degree, request.length, view.block_size, pref_depth, len(path)
            )
            self._counters.add_path(path[pref_depth:], preferred_degree, benefits, missed=True)
        self._pin(request.id, worker, tuple(b.key for b in path[:reused]))

    def _pin(self, request_id: int, worker: int, keys: tuple[int, ...]) -> None:
        # A re-placed request (drain) moves its pins to the new worker.
        self.request_done(request_id)
        if not keys:
            return
        pins = self._pins
        for k in keys:
            pins[(worker, k)] = pins.get((worker, k), 0) + 1
        self._pins_by_request[request_id] = (worker, keys)

    def request_done(self, request_id: int) -> None:
        """The request finished (or left its worker): unpin its reused path."""
        entry = self._pins_by_request.pop(request_id, None)
        if entry is None:
            return
        worker, keys = entry
        pins = self._pins
        for k in keys:
            n = pins[(worker, k)] - 1
            if n:
                pins[(worker, k)] = n
            else:
                del pins[(worker, k)]

    @property
    def pinned(self) -> int:
        """(worker, block) pairs that queued or running requests reuse now."""
        return len(self._pins)

    def in_use(self, worker: int, key: int) -> bool:
        """A queued or running request placed at ``worker`` reuses block ``key``."""
        return (worker, key) in self._pins

    # -- scan ----------------------------------------------------------------------

    def scan(self, view: CacheView) -> ScanPlan:
        """One periodic scan: rank candidates, select bounded operations, decay.

        ``plan.inter`` and ``plan.intra`` hold the head of each ranking that the
        selection read (it stops at the per-scan bound), ``plan.reclaim`` the
        first ``reclaim_ranked_per_scan``; :meth:`candidates` gives the full lists.
        """
        s, table = self.settings, self._counters
        table.follow(view.store, drain=True)
        ranking = self._ranking(view)
        plan = self.select(view, ranking)
        # A block stays tracked while some counter, after this scan's decay, is
        # still above counter_floor times the threshold it could cross.
        table.end_scan(
            keep_access=s.counter_floor * s.theta_intra / s.decay,
            keep_missed=s.counter_floor * s.theta_inter / s.decay,
            gone=list(ranking.gone),
        )
        plan.tracked_nodes = table.tracked_count()
        self.counts["scans"] += 1
        return plan

    def candidates(self, view: CacheView) -> ScanPlan:
        """The three ranked candidate lists for the current counters, without
        selecting operations or decaying (for inspection and tests)."""
        self._counters.follow(view.store)
        ranking = self._ranking(view)
        return ScanPlan(
            epoch=self.epoch,
            inter=list(ranking.inter),
            intra=list(ranking.intra),
            reclaim=ranking.reclaim_head(),
            tracked_nodes=self._counters.tracked_count(),
        )

    def _ranking(self, view: CacheView) -> Ranking:
        return Ranking(
            self._counters,
            self.settings,
            view.workers,
            view.store,
            self._covered,
            self._copy_dest,
            first_batch=self._first_batch,
        )

    # -- selection -----------------------------------------------------------------

    def select(self, view: CacheView, ranked: RankedLists) -> ScanPlan:
        """Choose this scan's bounded operations from ``ranked`` and start them
        (they are in flight from now on); no counter changes.

        :meth:`scan` runs it on its own :class:`Ranking`; any lists in rank
        order will do (the tests drive it with a naive full sort). In order:
        inter-degree copies, then intra-degree ones (each read from its list
        until ``max_*_per_scan`` copies started), then reclamations.
        """
        s = self.settings
        plan = ScanPlan(epoch=self.epoch)
        pool = _Pool(view, s)
        self._replicate(plan, pool, ranked.inter, plan.inter, s.max_inter_per_scan)
        self._replicate(plan, pool, ranked.intra, plan.intra, s.max_intra_per_scan)
        plan.reclaim = ranked.reclaim_head()
        self._reclaim(plan, pool)
        return plan

    def _replicate(
        self,
        plan: ScanPlan,
        pool: _Pool,
        stream: Iterator[Candidate],
        ranked: list[Candidate],
        bound: int,
    ) -> None:
        """Start up to ``bound`` copies from one replication list, reading it
        only as far as needed (the rest is never computed); every candidate
        read goes to ``ranked``. A candidate on the path of a copy chosen
        before needs none; one deeper on the path of a copy chosen in this
        scan extends that copy (:meth:`_extend_copy`)."""
        started = 0
        while started < bound:
            cand = next(stream, None)
            if cand is None:
                break
            ranked.append(cand)
            block = pool.store.block(cand.key)
            if block is None or (cand.key, cand.degree) in self._covered:
                continue
            path = pool.path(block)
            keys = tuple(b.key for b in path)
            if self._extend_copy(plan, pool, cand, path, keys):
                continue
            op = self._new_copy(pool, cand, path, keys)
            if op is None:
                continue
            plan.copies.append(op)
            self._track_copy(op)
            self.counts[f"{cand.kind}_started"] += 1
            started += 1

    def _extend_copy(
        self,
        plan: ScanPlan,
        pool: _Pool,
        cand: Candidate,
        path: Sequence[BlockInfo],
        keys: tuple[int, ...],
    ) -> bool:
        """Extend the first copy of this scan at the candidate's degree whose
        prefix is on the candidate's path to the candidate (its source still
        holds z and the destination has room for the longer copy). False: no
        such copy, or it cannot take the extension."""
        block = path[-1]
        depth_of = {b.key: b.depth for b in path}
        for i, op in enumerate(plan.copies):
            if op.degree != cand.degree or op.key not in depth_of:
                continue
            dst = pool.by_id[op.destination]
            src = pool.by_id[op.source]
            if src.id not in block.holders:
                return False
            missing = op.missing_blocks + (block.depth - depth_of[op.key])
            if missing > self.settings.max_copy_fraction * dst.cache_capacity_blocks:
                return False
            new = replace(
                op,
                key=cand.key,
                keys=keys,
                missing_blocks=missing,
                transfer_s=pool.transfer_s(missing, src, dst),
            )
            plan.copies[i] = new
            self._untrack_copy(op)
            self._track_copy(new)
            return True
        return False

    def _new_copy(
        self, pool: _Pool, cand: Candidate, path: Sequence[BlockInfo], keys: tuple[int, ...]
    ) -> Copy | None:
        """A copy for ``cand``: to the degree-C worker without z that lacks the
        fewest blocks of the path (and has room for them: at most
        ``max_copy_fraction`` of its cache), then the lightest load; from the
        lightest loaded holder (intra: a same-degree one). None: no
        destination or no source."""
        block = path[-1]
        dests = self._destinations(block, path, pool.by_degree.get(cand.degree, []))
        if not dests:
            return None
        dst, missing = min(dests, key=lambda x: (x[1], x[0].outstanding_s, x[0].id))
        by_id = pool.by_id
        if cand.kind == "intra":
            sources = [
                by_id[h] for h in block.holders if h in by_id and by_id[h].degree == cand.degree
            ]
        else:
            sources = [by_id[h] for h in block.holders if h in by_id]
        if not sources:
            return None
        src = min(sources, key=lambda w: (w.outstanding_s, w.id))
        return Copy(
            "intra" if cand.kind == "intra" else "inter",
            cand.key,
            cand.degree,
            src.id,
            dst.id,
            keys,
            missing,
            pool.transfer_s(missing, src, dst),
        )

    def _destinations(
        self, block: BlockInfo, path: Sequence[BlockInfo], peers: Sequence[WorkerState]
    ) -> list[tuple[WorkerState, int]]:
        """Feasible destinations among ``peers`` for a copy of ``block`` (its
        root→z ``path``) and the blocks each lacks."""
        out = []
        retained = _retained_depths(path)
        max_fraction = self.settings.max_copy_fraction
        for w in peers:
            if w.id in block.holders or (block.key, w.id) in self._copy_dest:
                continue
            missing = block.depth - retained.get(w.id, 0)
            if missing <= max_fraction * w.cache_capacity_blocks:
                out.append((w, missing))
        return out

    def _reclaim(self, plan: ScanPlan, pool: _Pool) -> None:
        """Start up to ``max_reclaim_per_scan`` reclamations from ``plan.reclaim``,
        in rank order: per candidate, one victim among its holders
        (:meth:`_reclaim_victim`) while ReplicaCount(z, C), less what this
        scan already reclaims of it, is at least ``reclaim_min_replicas``.
        With ``reclaim_for_room_only``, only at workers that copies in
        flight will fill beyond their free space, one block per block they
        need (:meth:`_room_needed`)."""
        s = self.settings
        room = self._room_needed(pool) if s.reclaim_for_room_only else None
        if room is not None and all(need <= 0 for need in room.values()):
            return  # no worker needs room: no holder of any candidate qualifies
        # (key, worker) reclaimed in this scan: a leaf freed here counts as gone.
        doomed: set[tuple[int, int]] = set()
        removed_from: dict[tuple[int, int], int] = {}
        for cand in plan.reclaim:
            if len(plan.reclaims) >= s.max_reclaim_per_scan:
                break
            pair = (cand.key, cand.degree)
            if cand.replicas - removed_from.get(pair, 0) < s.reclaim_min_replicas:
                continue
            victim = self._reclaim_victim(pool, cand, room, doomed)
            if victim is None:
                continue
            op = Reclaim(cand.key, cand.degree, victim.id)
            plan.reclaims.append(op)
            doomed.add((cand.key, victim.id))
            removed_from[pair] = removed_from.get(pair, 0) + 1
            self.start_reclaim(op)
            if room is not None:
                room[victim.id] -= 1

    def start_reclaim(self, op: Reclaim) -> None:
        """Book a reclamation as in flight (a scan's, or one an administrator asks for):
        the shell carries it out and reports with :meth:`reclaim_finished`, re-checking
        at the worker that the block is not in use and has no retained child."""
        if (op.key, op.worker) in self._reclaiming:
            raise ValueError(f"block {op.key:#x} is already being reclaimed at worker {op.worker}")
        self._reclaiming[(op.key, op.worker)] = op
        self._reclaiming_at[op.worker] = self._reclaiming_at.get(op.worker, 0) + 1
        self.counts["reclaims_started"] += 1

    def _room_needed(self, pool: _Pool) -> dict[int, int]:
        """Per destination of a copy in flight: the blocks those copies bring
        beyond its free space and the reclamations already under way there."""
        room: dict[int, int] = {}
        for op in self._copying.values():
            room[op.destination] = room.get(op.destination, 0) + op.missing_blocks
        for wid in list(room):
            dest = pool.by_id.get(wid)
            free = dest.cache_capacity_blocks - dest.cache_used_blocks if dest else 0
            room[wid] -= max(0, free) + self._reclaiming_at.get(wid, 0)
        return room

    def _reclaim_victim(
        self,
        pool: _Pool,
        cand: Candidate,
        room: dict[int, int] | None,
        doomed: set[tuple[int, int]],
    ) -> WorkerState | None:
        """The holder of z to reclaim it at: a degree-C worker not already
        reclaiming it, that needs the room (with ``room``), where z is not in
        use and is a leaf (no child of z held there, except ones reclaimed in
        this scan); the fullest cache first, then the most loaded, then the
        lowest id. None if no holder qualifies."""
        store = pool.store
        holders: Iterable[int] = store.holders(cand.key)
        if room is not None:
            holders = [h for h in holders if room.get(h, 0) > 0]  # a copy there needs the space
        children: list[tuple[int, Set[int]]] | None = None
        choices = []
        for h in holders:
            holder = pool.by_id.get(h)
            if holder is None or holder.degree != cand.degree:
                continue
            if (cand.key, h) in self._reclaiming or (cand.key, h) in doomed:
                continue
            if (h, cand.key) in self._pins:
                continue  # in use
            if children is None:
                # each child's holders, read once (not per holder)
                children = [(ch, store.holders(ch)) for ch in store.children(cand.key)]
            if any(h in held and (ch, h) not in doomed for ch, held in children):
                continue  # a retained descendant depends on it
            choices.append(holder)
        if not choices:
            return None
        occupancy = {
            w.id: w.cache_used_blocks / w.cache_capacity_blocks if w.cache_capacity_blocks else 0.0
            for w in choices
        }
        return min(choices, key=lambda w: (-occupancy[w.id], -w.outstanding_s, w.id))

    # -- operations in flight, reports from the shell ------------------------------

    def _track_copy(self, op: Copy) -> None:
        self._copying[(op.key, op.degree)] = op
        self._copy_dest.add((op.key, op.destination))
        cov = self._covered
        for k in op.keys:
            cov[(k, op.degree)] = cov.get((k, op.degree), 0) + 1

    def _untrack_copy(self, op: Copy) -> None:
        if self._copying.get((op.key, op.degree)) is not op:
            return
        del self._copying[(op.key, op.degree)]
        self._copy_dest.discard((op.key, op.destination))
        cov = self._covered
        for k in op.keys:
            n = cov[(k, op.degree)] - 1
            if n:
                cov[(k, op.degree)] = n
            else:
                del cov[(k, op.degree)]

    def copy_finished(self, op: Copy, installed: bool) -> None:
        """The destination reported the copy installed (or failed)."""
        self._untrack_copy(op)
        if installed:
            self.counts["copies_installed"] += 1
            self.counts["blocks_copied"] += op.missing_blocks
        else:
            self.counts["copies_failed"] += 1

    def reclaim_finished(self, op: Reclaim, deleted: bool) -> None:
        """The worker reported the deletion done (or refused it)."""
        if self._reclaiming.pop((op.key, op.worker), None) is not None:
            self._release_reclaim_slot(op.worker)
        self.counts["reclaims_done" if deleted else "reclaims_aborted"] += 1

    def workers_removed(self, removed: Sequence[int]) -> list[Copy | Reclaim]:
        """Reconcile with a reconfiguration: forget pins and in-flight operations
        that involve a worker that left the pool. Returns the dropped operations
        (the shell ignores their late completion reports)."""
        gone = set(removed)
        dropped: list[Copy | Reclaim] = []
        for op in list(self._copying.values()):
            if op.source in gone or op.destination in gone:
                self._untrack_copy(op)
                self.counts["copies_failed"] += 1
                dropped.append(op)
        for key, rop in list(self._reclaiming.items()):
            if rop.worker in gone:
                del self._reclaiming[key]
                self._release_reclaim_slot(rop.worker)
                dropped.append(rop)
        for rid, (worker, _keys) in list(self._pins_by_request.items()):
            if worker in gone:
                self.request_done(rid)
        return dropped

    def _release_reclaim_slot(self, worker: int) -> None:
        n = self._reclaiming_at.get(worker, 0) - 1
        if n > 0:
            self._reclaiming_at[worker] = n
        else:
            self._reclaiming_at.pop(worker, None)


def _retained_depths(path: Sequence[BlockInfo]) -> dict[int, int]:
    """Per worker, the depth of the deepest block of ``path`` (root first) it holds."""
    depths: dict[int, int] = {}
    for n in reversed(path):
        for h in n.holders:
            depths.setdefault(h, n.depth)
    return depths
