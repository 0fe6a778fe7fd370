"""The global prefix-cache manager (design.md section 6): a planner, no I/O.

Workers cache prefixes locally (:mod:`vertumnus.core.blockcache`); the global
:class:`~vertumnus.core.trie.PrefixTrie` says who holds what. This module
decides, from how requests actually use those prefixes, where to **copy** a
prefix (so more placement choices keep their cache hit) and which redundant
copies to **reclaim**. It never moves a byte: :meth:`CacheManager.scan`
returns a :class:`ScanPlan`, a shell carries it out (``vertumnus.sim.cachesim``
in the simulator) and reports back with :meth:`CacheManager.copy_finished` /
:meth:`CacheManager.reclaim_finished`. This is the planner/executor split of
``docs/style.md``.

Vocabulary, per trie node z (one block; the root→z path is the prefix):

- ``ReplicaCount(z, C)``: degree-C workers among z's holders.
- ``access[z, C]``: decaying count of requests at degree-C workers that reused z.
- ``missed[z, C]``: decaying sum of predicted service seconds lost by requests
  that *preferred* degree C (C_pref, design.md section 3) while no degree-C
  worker held z. Each node carries only the **marginal** benefit of its own
  block (reuse ending at z versus at its parent), so a long prefix is not
  counted once per ancestor.

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
live nodes). The scan visits only the *tracked* nodes — those whose counters
are still above ``counter_floor`` — and forgets the rest, so its cost follows
recent traffic, not the trie size. A node that dropped out has counters that
are negligible against every threshold, so it could only have been a
reclamation candidate; such cold replicas are left to the workers' own LRU
eviction, which removes exactly those first.

The work is split by job:

- :mod:`vertumnus.core.cachecounters`: the counters (a table read with
  NumPy; lazy decay of untracked nodes; the trie's removal log);
- :mod:`vertumnus.core.cacheranking`: the three ranked lists, computed only
  as far as the selection reads them (exactly the head a full sort gives,
  ``tests/cachemanager/test_scan_reference.py``);
- this module: settings, requests, the selection of bounded operations and
  the bookkeeping of operations in flight.

**Safety rules the plan obeys.**

- A copy carries the whole root→z path but only the destination's missing
  blocks are transferred (``Copy.missing_blocks``); its modeled transfer time
  is ``latency + missing·block_size·kv_bytes_per_token / (link_bandwidth ·
  min(C_src, C_dst))`` — every rank of the narrower side moves its share in
  parallel, and an inter-degree copy is re-partitioned for the destination
  geometry on the way.
- A copy is not a holder until the shell reports it installed (the trie only
  learns of it from the destination's cache events), so placement never counts
  on a replica still in flight. One copy per (z, C) is in flight at a time.
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
module-level state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from vertumnus.core.cachecounters import CounterTable, NodeStats, TrackedNodes
from vertumnus.core.cacheranking import Candidate, Ranking
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import PoolView
from vertumnus.core.trie import PrefixTrie, TrieNode
from vertumnus.core.types import Request, cached_tokens

__all__ = [
    "CacheManager",
    "CacheManagerSettings",
    "CacheView",
    "Candidate",
    "Copy",
    "NodeStats",
    "Reclaim",
    "ScanPlan",
    "marginal_benefits",
    "replica_count",
]


@dataclass(frozen=True)
class CacheManagerSettings:
    """Thresholds, bounds and the transfer model of the cache manager.

    Units: ``access`` counts reuse events, ``missed`` sums predicted seconds.
    Both are summed over scans with geometric ``decay``, so a steady rate of
    x events per scan interval settles at x / (1 − decay). Defaults and how
    they were chosen: ``docs/benchmarks/cachemanager.md``.
    """

    scan_interval_s: float = 1.0
    """Seconds between scans (used by the shell; the thresholds assume it)."""
    decay: float = 0.8
    """Factor every counter is multiplied by after each scan, in (0, 1). With
    1 s scans, 0.8 remembers about the last 5 s (1 / (1 − decay) intervals)."""
    theta_inter: float = 0.03
    """θ_inter, seconds of predicted prefill lost per block. A 512-token block
    saves ≈ 6-7 ms of CP4/CP8 prefill, so 0.03 s within a ~5 s memory is
    about one preferring request per second missing that block."""
    theta_intra: float = 5.0
    """θ_intra: decayed reuses per existing replica above which one more
    same-degree copy is made. 5 at decay 0.8 and 1 s scans is ≈ 1 reuse/s per
    replica: at ≈ 0.2 s per prefill, that prefix alone keeps its holder ~20 %
    busy, the point where queueing behind it starts to cost its reusers."""
    theta_reclaim: float = 1.0
    """θ_reclaim: decayed reuses per replica below which a replica is reclaimed
    (≈ 0.2 reuse/s). Must be below θ_intra so a prefix does not flap between
    copy and reclaim; a factor 5 apart."""
    max_inter_per_scan: int = 8
    """Inter-degree copies started per scan at most."""
    max_intra_per_scan: int = 8
    """Intra-degree copies started per scan at most."""
    max_reclaim_per_scan: int = 8
    """Blocks reclaimed per scan at most."""
    reclaim_for_room_only: bool = True
    """Reclaim only at workers that copies in flight will fill beyond their
    free space, and only as many blocks as those copies need: reclamation
    "recovers cache capacity for prefixes with greater demand". Our worker
    caches are LRU and always full, so without this (False: the paper's rule
    read literally) cold replicas are deleted even when nothing needs their
    room, which only loses later hits LRU would have kept."""
    reclaim_ranked_per_scan: int = 256
    """Reclamation candidates ranked per scan (the head of the list; the
    executed ones are fewer, ``max_reclaim_per_scan``, after skipping replicas
    in use or with retained descendants)."""
    tie_tolerance: float = 0.1
    """Intra ranking: access/r values within this relative band (geometric
    buckets of width 1 + tolerance) are near-ties, ordered by copy footprint.
    0: by access/r alone, highest first."""
    max_copy_fraction: float = 0.1
    """A destination qualifies only if the copy needs at most this fraction of
    its cache capacity ("enough capacity"): one copy must not flush a cache."""
    counter_floor: float = 0.05
    """A node stops being tracked (and its counters count as zero) once every
    ``access`` is below counter_floor·θ_intra and every ``missed`` below
    counter_floor·θ_inter: it would need 1/counter_floor times the demand it
    has left to become a replication candidate. Bounds the scan's work."""
    reclaim_min_replicas: int = 2
    """Reclamation considers (z, C) only when ReplicaCount(z, C) is at least
    this. 2 (default) thins redundant same-degree replicas only; 1 also
    removes a degree's only copy, which mostly duplicates what LRU eviction
    does anyway, at the risk of a later miss."""
    kv_bytes_per_token: int = 98304
    """KV bytes per token over all layers (Qwen3-30B-A3B: 48 layers × 4 KV
    heads × 128 × 2 (K, V) × 2 B = 96 KiB)."""
    link_bandwidth_bytes_per_s: float = 50e9
    """Per-rank bandwidth of a copy between workers (one 400 Gb/s RDMA NIC per
    GPU). A copy uses min(C_src, C_dst) ranks in parallel."""
    transfer_latency_s: float = 0.002
    """Fixed setup time of one copy (connection, install report)."""
    reclaim_delay_s: float = 0.001
    """Time for a worker to delete blocks and confirm (used by the shell)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {self.decay}")
        if self.scan_interval_s <= 0:
            raise ValueError(f"scan interval must be > 0, got {self.scan_interval_s}")
        if min(self.theta_inter, self.theta_intra, self.theta_reclaim) < 0:
            raise ValueError("thresholds must be >= 0")
        if not self.theta_reclaim < self.theta_intra:
            raise ValueError(
                f"theta_reclaim ({self.theta_reclaim}) must be below theta_intra "
                f"({self.theta_intra}) or replicas flap between copy and reclaim"
            )
        if self.reclaim_min_replicas < 1:
            raise ValueError("reclaim_min_replicas must be >= 1")
        if min(self.max_inter_per_scan, self.max_intra_per_scan, self.max_reclaim_per_scan) < 0:
            raise ValueError("per-scan bounds must be >= 0")
        if self.tie_tolerance < 0 or not 0 < self.max_copy_fraction <= 1:
            raise ValueError("tie_tolerance must be >= 0 and max_copy_fraction in (0, 1]")
        if self.link_bandwidth_bytes_per_s <= 0 or self.kv_bytes_per_token <= 0:
            raise ValueError("bandwidth and KV bytes per token must be > 0")
        if self.transfer_latency_s < 0 or self.reclaim_delay_s < 0 or self.counter_floor < 0:
            raise ValueError("latencies and the counter floor must be >= 0")


class CacheView(PoolView, Protocol):
    """What the manager reads: a policy's view of the pool, plus the trie."""

    @property
    def trie(self) -> PrefixTrie: ...

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

    def __bool__(self) -> bool:
        return bool(self.copies or self.reclaims)


def replica_count(node: TrieNode, degree: int, degree_of: Mapping[int, int]) -> int:
    """ReplicaCount(z, C): holders of z that are degree-C workers in ``degree_of``."""
    return sum(1 for h in node.holders if degree_of.get(h) == degree)


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


class CacheManager:
    """Counters, pins and in-flight operations of the global prefix-cache manager.

    The shell calls :meth:`observe_request` after each placement,
    :meth:`request_done` when a request finishes, :meth:`scan` every
    ``scan_interval_s``, and :meth:`copy_finished` / :meth:`reclaim_finished`
    when a worker reports an operation done.
    """
    def __init__(self, settings: CacheManagerSettings | None = None) -> None:
        self.settings = settings or CacheManagerSettings()
        self._counters = CounterTable(self.settings.decay)
        self._pins: dict[tuple[int, int], int] = {}
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
    def tracked(self) -> Mapping[int, TrieNode]:
        """Nodes whose counters may be above the floor, by block key."""
        return TrackedNodes(self._counters)

    # -- counters ---------------------------------------------------------------

    def record(self, node: TrieNode, degree: int, access: float = 0.0, missed: float = 0.0) -> None:
        """Add ``access`` to access[z, C] and ``missed`` to missed[z, C] (z = ``node``)."""
        self._counters.record(node, degree, access, missed)

    def counters(self, node: TrieNode) -> tuple[dict[int, float], dict[int, float]]:
        """(access, missed) of ``node`` per degree as of now (for tests and tools)."""
        return self._counters.counters(node)

    def observe_request(
        self,
        request: Request,
        worker: int,
        preferred_degree: int,
        view: CacheView,
        path: Sequence[TrieNode] | None = None,
    ) -> None:
        """Fold one placement into the counters and pin its reused path.

        ``path`` is MatchedPath(i) (computed from the trie if not given);
        ``worker`` the chosen worker; ``preferred_degree`` C_pref(i), 0 if unknown.
        """
        trie = view.trie
        self._counters.follow(trie)
        if path is None:
            path = trie.match(request.block_keys)
        degree_of = {w.id: w.degree for w in view.workers}
        degree_w = degree_of.get(worker, 0)
        # ReusedPath(i, w): holders of a node hold every ancestor, so the
        # reused part is a prefix of the matched path.
        reused = 0
        pref_depth = 0
        for node in path:
            holders = node.holders
            if not holders:
                break
            if worker in holders:
                reused = node.depth
            if preferred_degree and any(degree_of.get(h) == preferred_degree for h in holders):
                pref_depth = node.depth
        if reused:
            self._counters.add_path(path[:reused], degree_w, None, missed=False)
        if preferred_degree and pref_depth < len(path):
            # Nodes deeper than pref_depth have ReplicaCount(z, C_pref) = 0.
            benefits = marginal_benefits(
                view.model, preferred_degree, request.length, view.block_size, pref_depth, len(path)
            )
            self._counters.add_path(path[pref_depth:], preferred_degree, benefits, missed=True)
        self._pin(request.id, worker, tuple(n.key for n in path[:reused]))

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
        table.follow(view.trie, drain=True)
        ranking = self._ranking(view)
        plan = ScanPlan(epoch=self.epoch)
        self._select(plan, view, ranking)
        # A node stays tracked while some counter, after this scan's decay, is
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
        self._counters.follow(view.trie)
        ranking = self._ranking(view)
        return ScanPlan(
            epoch=self.epoch,
            inter=list(ranking.inter),
            intra=list(ranking.intra),
            reclaim=ranking.reclaim_head(),
            tracked_nodes=self._counters.tracked_count(),
        )

    def _ranking(self, view: CacheView) -> Ranking:
        return Ranking(self._counters, self.settings, view, self._covered, self._copy_dest)

    def _destinations(
        self, node: TrieNode, peers: Sequence[WorkerState], max_fraction: float
    ) -> list[tuple[WorkerState, int]]:
        """Feasible destinations for a copy of ``node`` and the blocks each lacks."""
        out = []
        retained = _retained_depths(node)
        for w in peers:
            if w.id in node.holders or (node.key, w.id) in self._copy_dest:
                continue
            missing = node.depth - retained.get(w.id, 0)
            if missing <= max_fraction * w.cache_capacity_blocks:
                out.append((w, missing))
        return out

    def _select(self, plan: ScanPlan, view: CacheView, ranking: Ranking) -> None:
        s = self.settings
        workers = [w for w in view.workers if w.available]
        by_id = {w.id: w for w in workers}
        by_degree: dict[int, list[WorkerState]] = {}
        for w in workers:
            by_degree.setdefault(w.degree, []).append(w)
        nodes = view.trie.nodes
        block_bytes = view.block_size * s.kv_bytes_per_token

        def transfer_s(missing: int, src: WorkerState, dst: WorkerState) -> float:
            bw = s.link_bandwidth_bytes_per_s * min(src.degree, dst.degree)
            return s.transfer_latency_s + missing * block_bytes / bw

        for stream, ranked, bound in (
            (ranking.inter, plan.inter, s.max_inter_per_scan),
            (ranking.intra, plan.intra, s.max_intra_per_scan),
        ):
            started = 0
            # Read the ranking only as far as needed: the rest is never computed.
            while started < bound:
                cand = next(stream, None)
                if cand is None:
                    break
                ranked.append(cand)
                node = nodes[cand.key]
                if (cand.key, cand.degree) in self._covered:
                    continue  # on the path of a copy chosen earlier in this scan
                path = _path(node)
                path_keys = tuple(n.key for n in path)
                key_set = set(path_keys)
                # A deeper candidate on a path already being copied in this scan
                # extends that copy instead of starting another.
                merged = False
                for i, op in enumerate(plan.copies):
                    if op.degree == cand.degree and op.key in key_set:
                        dst = by_id[op.destination]
                        src = by_id[op.source]
                        if cand.key not in nodes or src.id not in node.holders:
                            break
                        missing = op.missing_blocks + (node.depth - nodes[op.key].depth)
                        if missing > s.max_copy_fraction * dst.cache_capacity_blocks:
                            break
                        # the same copy, extended to the deeper candidate
                        new = replace(
                            op,
                            key=cand.key,
                            keys=path_keys,
                            missing_blocks=missing,
                            transfer_s=transfer_s(missing, src, dst),
                        )
                        plan.copies[i] = new
                        self._untrack_copy(op)
                        self._track_copy(new)
                        merged = True
                        break
                if merged:
                    continue
                dests = self._destinations(
                    node, by_degree.get(cand.degree, []), s.max_copy_fraction
                )
                if not dests:
                    continue
                # Longest retained ancestor path first, then the lightest load.
                dst, missing = min(dests, key=lambda x: (x[1], x[0].outstanding_s, x[0].id))
                if cand.kind == "intra":
                    sources = [
                        by_id[h]
                        for h in node.holders
                        if h in by_id and by_id[h].degree == cand.degree
                    ]
                else:
                    sources = [by_id[h] for h in node.holders if h in by_id]
                if not sources:
                    continue
                src = min(sources, key=lambda w: (w.outstanding_s, w.id))
                op = Copy(
                    "intra" if cand.kind == "intra" else "inter",
                    cand.key,
                    cand.degree,
                    src.id,
                    dst.id,
                    path_keys,
                    missing,
                    transfer_s(missing, src, dst),
                )
                plan.copies.append(op)
                self._track_copy(op)
                self.counts[f"{cand.kind}_started"] += 1
                started += 1

        plan.reclaim = ranking.reclaim_head()
        # Reclamation: leaf blocks only, leaves freed in this scan count as gone.
        # With reclaim_for_room_only, only where incoming copies need the room.
        room: dict[int, int] | None = None
        if s.reclaim_for_room_only:
            room = {}
            for op in self._copying.values():
                room[op.destination] = room.get(op.destination, 0) + op.missing_blocks
            for wid in list(room):
                dest = by_id.get(wid)
                free = dest.cache_capacity_blocks - dest.cache_used_blocks if dest else 0
                room[wid] -= max(0, free) + self._reclaiming_at.get(wid, 0)
        doomed: set[tuple[int, int]] = set()
        removed_from: dict[tuple[int, int], int] = {}
        for cand in plan.reclaim:
            if len(plan.reclaims) >= s.max_reclaim_per_scan:
                break
            node = nodes[cand.key]
            if (
                cand.replicas - removed_from.get((cand.key, cand.degree), 0)
                < s.reclaim_min_replicas
            ):
                continue
            choices = []
            for h in node.holders:
                holder = by_id.get(h)
                if holder is None or holder.degree != cand.degree:
                    continue
                if (cand.key, h) in self._reclaiming or (cand.key, h) in doomed:
                    continue
                if room is not None and room.get(h, 0) <= 0:
                    continue  # no copy there needs the space
                if (h, cand.key) in self._pins:
                    continue  # in use
                if any(
                    h in ch.holders and (ch.key, h) not in doomed for ch in node.children.values()
                ):
                    continue  # a retained descendant depends on it
                choices.append(holder)
            if not choices:
                continue
            occupancy = {
                w.id: w.cache_used_blocks / w.cache_capacity_blocks
                if w.cache_capacity_blocks
                else 0.0
                for w in choices
            }
            victim = min(choices, key=lambda w: (-occupancy[w.id], -w.outstanding_s, w.id))
            op_r = Reclaim(cand.key, cand.degree, victim.id)
            plan.reclaims.append(op_r)
            doomed.add((cand.key, victim.id))
            removed_from[(cand.key, cand.degree)] = removed_from.get((cand.key, cand.degree), 0) + 1
            self._reclaiming[(cand.key, victim.id)] = op_r
            self._reclaiming_at[victim.id] = self._reclaiming_at.get(victim.id, 0) + 1
            if room is not None:
                room[victim.id] -= 1
            self.counts["reclaims_started"] += 1

    # -- reports from the shell -------------------------------------------------

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

    @property
    def copies_in_flight(self) -> list[Copy]:
        return list(self._copying.values())

    @property
    def reclaims_in_flight(self) -> list[Reclaim]:
        return list(self._reclaiming.values())


def _path(node: TrieNode) -> list[TrieNode]:
    """The root→z path, root first."""
    out = []
    n: TrieNode | None = node
    while n is not None:
        out.append(n)
        n = n.parent
    out.reverse()
    return out


def _retained_depths(node: TrieNode) -> dict[int, int]:
    """Per worker, the depth of the deepest ancestor of z (z included) it holds."""
    depths: dict[int, int] = {}
    n: TrieNode | None = node
    while n is not None:
        for h in n.holders:
            depths.setdefault(h, n.depth)
        n = n.parent
    return depths
