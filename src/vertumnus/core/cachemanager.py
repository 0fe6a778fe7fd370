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
eviction, which removes exactly those first. The counters of tracked nodes
form a table (a row per node, a column per degree) that requests update cell
by cell and a scan reads with NumPy: thresholds, forgetting and decay are
vector operations. Ranking is lazy (:class:`_Ranking`): a bound on each
candidate's rank key that needs no trie walk orders the work, and exact keys
(replica counts, footprint walks) are computed only for the head of each list
that the bounded selection reads — the same head a full sort gives
(``tests/cachemanager/test_scan_reference.py``). The trie reports the nodes it
drops (``PrefixTrie.removal_log``), so no scan checks every tracked node for
having left it. Counters of nodes that are not tracked decay lazily: stored
with the scan epoch they are exact at, scaled by ``decay**(epochs elapsed)``
when touched again.

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

import heapq
import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import WorkerState
from vertumnus.core.policies.base import PoolView
from vertumnus.core.trie import PrefixTrie, RemovalLog, TrieNode
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

_T = TypeVar("_T")
_V = TypeVar("_V")


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


_FORGOTTEN = -1
"""``NodeStats.slot`` of a node the scans stopped tracking (counters below the floor)."""
_GONE = -2
"""``NodeStats.slot`` of a node that left the trie: never tracked again (a key
that comes back is a new node, with fresh counters)."""


class NodeStats:
    """Handle to one node's decaying counters, kept in ``TrieNode.stats``.

    While the node is tracked (``slot`` ≥ 0) its counters are row ``slot`` of
    its manager's counter table and are current: each scan decays the whole
    table at once, vectorized. Once the node is forgotten (``slot`` −1: its
    counters fell below the floor) or has left the trie (−2) they are kept
    here, exact as of ``epoch``; the value at a later epoch e is ``value ·
    decay**(e − epoch)`` (lazy decay), and touching a forgotten node tracks it
    again. ``access`` and ``missed`` are read-only snapshots as of ``epoch``.
    """

    __slots__ = ("owner", "slot", "_epoch", "_access", "_missed")

    def __init__(self, owner: CacheManager) -> None:
        self.owner = owner
        self.slot = _FORGOTTEN
        self._epoch = owner.epoch
        # While not tracked: the values per column of the owner's table.
        self._access: Sequence[float] = ()
        self._missed: Sequence[float] = ()

    @property
    def epoch(self) -> int:
        return self.owner.epoch if self.slot >= 0 else self._epoch

    @property
    def access(self) -> dict[int, float]:
        """access[z, C] per degree C, as of ``epoch``."""
        return self.owner._values(self, missed=False)

    @property
    def missed(self) -> dict[int, float]:
        """missed[z, C] per degree C, as of ``epoch``."""
        return self.owner._values(self, missed=True)

    def __repr__(self) -> str:
        return f"NodeStats(access={self.access}, missed={self.missed}, epoch={self.epoch})"


class _Tracked(Mapping[int, TrieNode]):
    """Read-only view of the tracked nodes by block key."""

    __slots__ = ("_mgr",)

    def __init__(self, mgr: CacheManager) -> None:
        self._mgr = mgr

    def __getitem__(self, key: int) -> TrieNode:
        mgr = self._mgr
        slot = mgr._slot_of[key]
        node = mgr._nodes[slot]
        if node is None or mgr._depth[slot] <= 0:
            raise KeyError(key)
        return node

    def __contains__(self, key: object) -> bool:
        slot = self._mgr._slot_of.get(key)  # type: ignore[call-overload]
        return slot is not None and self._mgr._depth[slot] > 0

    def __iter__(self) -> Iterator[int]:
        depth = self._mgr._depth
        return (k for k, slot in list(self._mgr._slot_of.items()) if depth[slot] > 0)

    def __len__(self) -> int:
        return self._mgr._tracked_count()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A (z, C) that crossed a threshold in a scan."""

    kind: Literal["inter", "intra", "reclaim"]
    key: int
    degree: int
    replicas: int
    """ReplicaCount(z, C) at the scan."""
    score: float
    """inter: missed per copied block; intra and reclaim: access / r."""
    footprint: int = 0
    """Replication: fewest blocks any feasible destination lacks; 0 for reclaim."""
    depth: int = 0


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
        self.epoch = 0
        """Scans completed; counters decay once per epoch."""
        # The counter table of the tracked nodes, one row (slot) per node and
        # one column per degree, as flat arrays a scan views with NumPy
        # without copying, while a request updates single cells at Python
        # speed. Free slots hold zeros and depth 0.
        self._degrees: list[int] = []
        """Column → degree."""
        self._column_of: dict[int, int] = {}
        self._access: list[array[float]] = []
        """Per column, access[z, C] of each slot's node."""
        self._missed: list[array[float]] = []
        """Per column, missed[z, C] of each slot's node."""
        self._depth: array[int] = array("q")
        """Per slot: the node's depth while tracked; minus it while forgotten in
        place (the node keeps the slot and its counters until the slot is
        reused); 0 when free."""
        self._keys: array[int] = array("Q")
        """Block keys, for the reclamation order; 0 for a key outside 64 bits
        unsigned (then ``_wide_keys`` and a scan orders keys in Python)."""
        self._wide_keys = False
        self._nodes: list[TrieNode | None] = []
        self._free: list[int] = []
        """Slots to reuse; an entry whose slot was tracked again since is skipped."""
        self._slot_of: dict[int, int] = {}
        """Slot of each node that has one (tracked or forgotten in place), by block key."""
        self._trie: PrefixTrie | None = None
        self._removals: RemovalLog | None = None
        """The nodes the trie dropped since the last scan (PrefixTrie.removal_log)."""
        self._grow(64)
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
    def tracked(self) -> Mapping[int, TrieNode]:
        """Nodes whose counters may be above the floor, by block key."""
        return _Tracked(self)

    # -- counters ---------------------------------------------------------------

    def _grow(self, cap: int) -> None:
        """Make room for ``cap`` slots. New arrays, not in-place growth: a NumPy
        view of the old ones (a scan's) would forbid resizing them."""
        old = len(self._nodes)

        def bigger(a: array[Any]) -> array[Any]:
            b = array(a.typecode, bytes(a.itemsize * cap))
            b[:old] = a
            return b

        self._access = [bigger(a) for a in self._access]
        self._missed = [bigger(a) for a in self._missed]
        self._depth = bigger(self._depth)
        self._keys = bigger(self._keys)
        self._nodes.extend([None] * (cap - old))
        self._free.extend(range(cap - 1, old - 1, -1))

    def _column(self, degree: int) -> int:
        col = self._column_of.get(degree)
        if col is None:
            col = self._column_of[degree] = len(self._degrees)
            self._degrees.append(degree)
            n = len(self._nodes)
            self._access.append(array("d", bytes(8 * n)))
            self._missed.append(array("d", bytes(8 * n)))
        return col

    def _track(self, node: TrieNode) -> int:
        """The slot of ``node``'s counters, tracking it (again) if needed; −1 for
        a node that left the trie (its counters stay on its NodeStats)."""
        st = node.stats
        if type(st) is NodeStats and st.owner is self:
            slot = st.slot
            if slot >= 0:
                if self._depth[slot] < 0:
                    # Forgotten in place: its counters stayed in the table (and
                    # were decayed with it), so tracking it again is one write.
                    self._depth[slot] = node.depth
                return slot
            if slot == _GONE:
                return -1
        else:
            st = NodeStats(self)
            node.stats = st
        key = node.key
        other = self._slot_of.get(key)
        if other is not None:
            # Another node object under this key, so that one left the trie (or
            # its stats were reset): its counters are not this node's.
            self._release_slots([other], _GONE)
        slot = self._alloc()
        self._nodes[slot] = node
        self._depth[slot] = node.depth
        if 0 <= key < 1 << 64:
            self._keys[slot] = key
        else:
            self._wide_keys = True
        self._slot_of[key] = slot
        st.slot = slot
        if st._access or st._missed:
            f = self.settings.decay ** (self.epoch - st._epoch)
            for col, v in enumerate(st._access):
                self._access[col][slot] = v * f
            for col, v in enumerate(st._missed):
                self._missed[col][slot] = v * f
            st._access = st._missed = ()
        return slot

    def _alloc(self) -> int:
        while True:
            if not self._free:
                self._grow(2 * len(self._nodes))  # (new arrays)
            slot = self._free.pop()
            if self._depth[slot] <= 0:
                break  # (> 0: tracked again in place since it was listed)
        if self._depth[slot] < 0:
            # Forgotten in place: only now do its counters move to its NodeStats,
            # one node per new one, so forgetting costs a scan no Python work.
            self._archive(slot, _FORGOTTEN)
        return slot

    def _archive(self, slot: int, state: int) -> None:
        """``_release_slots`` for one slot, at Python speed, without listing it."""
        node = self._nodes[slot]
        assert node is not None
        st = node.stats
        if type(st) is NodeStats and st.owner is self and st.slot == slot:
            st.slot = state
            st._epoch = self.epoch
            st._access = tuple(a[slot] for a in self._access)
            st._missed = tuple(a[slot] for a in self._missed)
        for a in self._access:
            a[slot] = 0.0
        for a in self._missed:
            a[slot] = 0.0
        self._depth[slot] = 0
        self._nodes[slot] = None
        if self._slot_of.get(node.key) == slot:
            del self._slot_of[node.key]

    def _tracked_count(self) -> int:
        return int(np.count_nonzero(np.frombuffer(self._depth, dtype=np.int64) > 0))

    def _release_slots(self, slots: Sequence[int], state: int, free: bool = True) -> None:
        """Give up the slots ``slots`` (tracked or forgotten in place): their
        nodes' counters move to their NodeStats (``state``: _FORGOTTEN or
        _GONE) and the slots are zeroed and (with ``free``) listed for reuse."""
        if len(slots) < 32:
            for slot in slots:
                self._archive(slot, state)
            if free:
                self._free.extend(slots)
            return
        idx = np.array(slots, dtype=np.intp)
        acc = [np.frombuffer(a, dtype=np.float64) for a in self._access]
        mis = [np.frombuffer(a, dtype=np.float64) for a in self._missed]
        # One tuple of values per slot, built in C (zip), then zeroed in place.
        acc_rows = list(zip(*[a[idx].tolist() for a in acc], strict=True))
        mis_rows = list(zip(*[a[idx].tolist() for a in mis], strict=True))
        for a in acc + mis:
            a[idx] = 0.0
        np.frombuffer(self._depth, dtype=np.int64)[idx] = 0
        del acc, mis
        nodes, slot_of, epoch = self._nodes, self._slot_of, self.epoch
        for slot, ra, rm in zip(slots, acc_rows, mis_rows, strict=True):
            node = nodes[slot]
            assert node is not None
            st = node.stats
            if type(st) is NodeStats and st.owner is self and st.slot == slot:
                st.slot = state
                st._epoch = epoch
                st._access = ra
                st._missed = rm
            nodes[slot] = None
            if slot_of.get(node.key) == slot:
                del slot_of[node.key]
        if free:
            self._free.extend(slots)

    def _values(self, st: NodeStats, missed: bool) -> dict[int, float]:
        """The counters of ``st`` per degree as of its epoch (see NodeStats)."""
        if st.slot >= 0:
            cols = self._missed if missed else self._access
            slot = st.slot
            return {self._degrees[c]: a[slot] for c, a in enumerate(cols) if a[slot]}
        vals = st._missed if missed else st._access
        return {self._degrees[c]: v for c, v in enumerate(vals) if v}

    def _record_untracked(self, st: NodeStats, degree: int, access: float, missed: float) -> None:
        """Count for a node that left the trie: on its NodeStats, never tracked."""
        f = self.settings.decay ** (self.epoch - st._epoch)
        n = len(self._degrees)
        acc = [v * f for v in st._access] + [0.0] * (n - len(st._access))
        mis = [v * f for v in st._missed] + [0.0] * (n - len(st._missed))
        col = self._column_of[degree]
        acc[col] += access
        mis[col] += missed
        st._access, st._missed, st._epoch = acc, mis, self.epoch

    def record(self, node: TrieNode, degree: int, access: float = 0.0, missed: float = 0.0) -> None:
        """Add ``access`` to access[z, C] and ``missed`` to missed[z, C] (z = ``node``)."""
        slot = self._track(node)
        col = self._column(degree)
        if slot < 0:
            assert isinstance(node.stats, NodeStats)
            self._record_untracked(node.stats, degree, access, missed)
            return
        if access:
            self._access[col][slot] += access
        if missed:
            self._missed[col][slot] += missed

    def counters(self, node: TrieNode) -> tuple[dict[int, float], dict[int, float]]:
        """(access, missed) of ``node`` per degree as of now (for tests and tools)."""
        st = node.stats
        if not isinstance(st, NodeStats):
            return {}, {}
        access, missed = st.access, st.missed
        if st.slot >= 0:
            return access, missed
        f = self.settings.decay ** (self.epoch - st.epoch)
        return ({c: v * f for c, v in access.items()}, {c: v * f for c, v in missed.items()})

    def _attach(self, trie: PrefixTrie) -> None:
        """Learn of the nodes ``trie`` drops from now on (PrefixTrie.removal_log)."""
        if trie is self._trie:
            return
        self._trie = trie
        self._removals = trie.removal_log()
        # Nodes tracked before (record() needs no view) that are not in it.
        nodes = trie.nodes
        self._release_slots(
            [
                s
                for s, n in enumerate(self._nodes)
                if n is not None and nodes.get(n.key) is not n
            ],
            _GONE,
        )

    def _drain_removals(self) -> None:
        """Forget the tracked nodes that left the trie since the last scan."""
        log = self._removals
        if log is None or not log.nodes:
            return
        dropped, log.nodes = log.nodes, []
        slots = []
        for node in dropped:
            st = node.stats
            if type(st) is NodeStats and st.owner is self:
                if st.slot >= 0 and self._nodes[st.slot] is node:
                    slots.append(st.slot)
                elif st.slot == _FORGOTTEN:
                    st.slot = _GONE
        self._release_slots(slots, _GONE)

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
        if trie is not self._trie:
            self._attach(trie)
        elif self._removals is not None and len(self._removals.nodes) > 65536:
            self._drain_removals()  # scans are rare: keep the log bounded
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
            col = self._column(degree_w)
            for node in path[:reused]:
                st = node.stats
                slot = st.slot if type(st) is NodeStats and st.owner is self else -1
                if slot < 0 or self._depth[slot] <= 0:
                    slot = self._track(node)  # may grow the table: index it afresh
                    if slot < 0:
                        self.record(node, degree_w, access=1.0)
                        continue
                self._access[col][slot] += 1.0
        if preferred_degree and pref_depth < len(path):
            # Nodes deeper than pref_depth have ReplicaCount(z, C_pref) = 0.
            benefits = marginal_benefits(
                view.model, preferred_degree, request.length, view.block_size, pref_depth, len(path)
            )
            col = self._column(preferred_degree)
            for node, gain in zip(path[pref_depth:], benefits, strict=True):
                if gain <= 0.0:
                    continue  # the capped last token of a fully cached prompt
                st = node.stats
                slot = st.slot if type(st) is NodeStats and st.owner is self else -1
                if slot < 0 or self._depth[slot] <= 0:
                    slot = self._track(node)
                    if slot < 0:
                        self.record(node, preferred_degree, missed=gain)
                        continue
                self._missed[col][slot] += gain
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
        if view.trie is not self._trie:
            self._attach(view.trie)
        self._drain_removals()
        ranking = _Ranking(self, view, forget=True)
        plan = ScanPlan(epoch=self.epoch)
        self._select(plan, view, ranking)
        ranking.finish()
        plan.tracked_nodes = self._tracked_count()
        self.epoch += 1
        self.counts["scans"] += 1
        return plan

    def candidates(self, view: CacheView) -> ScanPlan:
        """The three ranked candidate lists for the current counters, without
        selecting operations or decaying (for inspection and tests)."""
        if view.trie is not self._trie:
            self._attach(view.trie)
        ranking = _Ranking(self, view, forget=False)
        return ScanPlan(
            epoch=self.epoch,
            inter=list(ranking.inter),
            intra=list(ranking.intra),
            reclaim=ranking.reclaim_head(),
            tracked_nodes=self._tracked_count(),
        )

    def _compact(self) -> None:
        """Renumber the tracked slots 0..n−1 in a table about twice that size, so
        a scan's vector work follows the tracked nodes, not a past peak. The
        nodes forgotten in place move their counters to their NodeStats (a
        one-off cost per node, after a burst of traffic has passed)."""
        depth = np.frombuffer(self._depth, dtype=np.int64)
        self._release_slots(np.flatnonzero(depth < 0).tolist(), _FORGOTTEN, free=False)
        keep = np.flatnonzero(depth > 0)
        n = int(keep.size)
        cap = max(64, 2 * n)

        def moved(a: array[Any], dtype: type) -> array[Any]:
            b = array(a.typecode, bytes(a.itemsize * cap))
            np.frombuffer(b, dtype=dtype)[:n] = np.frombuffer(a, dtype=dtype)[keep]
            return b

        self._access = [moved(a, np.float64) for a in self._access]
        self._missed = [moved(a, np.float64) for a in self._missed]
        self._depth = moved(self._depth, np.int64)
        self._keys = moved(self._keys, np.uint64)
        del depth
        old_nodes = self._nodes
        self._nodes = [old_nodes[s] for s in keep.tolist()] + [None] * (cap - n)
        for new, (old, node) in enumerate(zip(keep.tolist(), self._nodes, strict=False)):
            assert node is not None
            st = node.stats
            if type(st) is NodeStats and st.owner is self and st.slot == old:
                st.slot = new
            if self._slot_of.get(node.key) == old:
                self._slot_of[node.key] = new
        self._free = list(range(cap - 1, n - 1, -1))

    def _destinations(
        self,
        node: TrieNode,
        peers: Sequence[WorkerState],
        max_fraction: float,
        memo: dict[int, dict[int, int]] | None = None,
        copy_dest: set[tuple[int, int]] | None = None,
    ) -> list[tuple[WorkerState, int]]:
        """Feasible destinations for a copy of ``node`` and the blocks each lacks
        (``copy_dest``: the in-flight copies' (key, destination), by default now)."""
        if copy_dest is None:
            copy_dest = self._copy_dest
        out = []
        retained = _retained_depths(node, memo)
        for w in peers:
            if w.id in node.holders or (node.key, w.id) in copy_dest:
                continue
            missing = node.depth - retained.get(w.id, 0)
            if missing <= max_fraction * w.cache_capacity_blocks:
                out.append((w, missing))
        return out

    def _select(self, plan: ScanPlan, view: CacheView, ranking: _Ranking) -> None:
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


def _retained_depths(
    node: TrieNode, memo: dict[int, dict[int, int]] | None = None
) -> dict[int, int]:
    """Per worker, the depth of the deepest ancestor of z (z included) it holds.

    ``memo`` (block key → result) shares the work between the many candidates
    of one scan that lie on the same paths: each node then costs O(workers).
    """
    if memo is None:
        memo = {}
    # Walk up to the first memoized ancestor, then fill in downwards.
    chain = []
    n: TrieNode | None = node
    while n is not None and n.key not in memo:
        chain.append(n)
        n = n.parent
    depths = memo[n.key] if n is not None else {}
    for m in reversed(chain):
        if m.holders:
            depths = dict(depths)
            for h in m.holders:
                depths[h] = m.depth
        memo[m.key] = depths
    return depths


class _Ranking:
    """One scan's three candidate lists, in rank order, computed as far as read.

    First, vectorized over the counter table: the (z, C) that can cross a
    threshold at all, and for each a bound on its rank key that needs no trie
    walk (the score with the most favourable replica count and footprint).
    Then the exact keys — replica counts from the holders, footprints from
    path walks — are computed in the order of that bound and only as far as
    the reader goes (:func:`_exact_order`). A scan executes a bounded number
    of operations (``max_*_per_scan``), so it reads the head of each list and
    the rest is never computed; the head is exactly what a full sort would
    put first (``tests/cachemanager/test_scan_reference.py`` compares them).
    """

    def __init__(self, mgr: CacheManager, view: CacheView, forget: bool) -> None:
        s = mgr.settings
        self.mgr = mgr
        self.settings = s
        self.forget = forget
        workers = [w for w in view.workers if w.available]
        self.by_degree: dict[int, list[WorkerState]] = {}
        for w in workers:
            self.by_degree.setdefault(w.degree, []).append(w)
        self.ids = {c: frozenset(w.id for w in ws) for c, ws in self.by_degree.items()}
        """Available worker ids per degree: ReplicaCount(z, C) = |holders ∩ ids[C]|."""
        self.room = {w.id: s.max_copy_fraction * w.cache_capacity_blocks for w in workers}
        """Most blocks a copy to each worker may need ("enough capacity")."""
        for c in sorted(self.by_degree):
            mgr._column(c)  # a column per available degree (reclamation reads zeros too)
        self.trie_nodes = view.trie.nodes
        # Rank as of the scan's start: the selection adds copies (and their
        # paths and destinations) while it reads the lists.
        self.covered = set(mgr._covered)
        self.copy_dest = set(mgr._copy_dest)
        self.copy_dest_keys = {k for k, _ in self.copy_dest}
        self.gone: set[int] = set()
        """Slots whose node turned out not to be in the trie."""
        self.access = [np.frombuffer(a, dtype=np.float64) for a in mgr._access]
        self.missed = [np.frombuffer(a, dtype=np.float64) for a in mgr._missed]
        self.depth = np.frombuffer(mgr._depth, dtype=np.int64)
        self.columns = [(col, c) for col, c in enumerate(mgr._degrees) if c in self.by_degree]
        first = 4 * max(s.max_inter_per_scan, s.max_intra_per_scan) + 16
        self.inter: Iterator[Candidate] = self._inter(first)
        self.intra: Iterator[Candidate] = self._intra(first)

    def _node(self, slot: int) -> TrieNode | None:
        """The node in ``slot`` if it is (still) in the trie."""
        node = self.mgr._nodes[slot]
        if node is None or self.trie_nodes.get(node.key) is not node:
            if self.forget:
                self.gone.add(slot)
            return None
        return node

    def _pairs(
        self, select: Callable[[int, int], np.ndarray[Any, Any]]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(slots, columns) of the (z, C) whose slot ``select(col, degree)`` lists."""
        slots, cols = [], []
        for col, c in self.columns:
            sl = select(col, c)
            slots.append(sl)
            cols.append(np.full(sl.size, col, dtype=np.intp))
        if not slots:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
        return np.concatenate(slots), np.concatenate(cols)

    def _footprint(self, node: TrieNode, c: int) -> int | None:
        """Fewest blocks a feasible degree-C destination lacks for a copy of z, or
        None: ``min(missing for _, missing in CacheManager._destinations(...))``
        (as of the scan's start) by one walk up from z that stops at the first
        feasible destination, since what a destination lacks only grows with
        the distance to the deepest ancestor it holds."""
        key, depth = node.key, node.depth
        pend = self.ids[c] - node.holders
        if key in self.copy_dest_keys:
            pend = frozenset(w for w in pend if (key, w) not in self.copy_dest)
        if not pend:
            return None
        room = self.room
        reach = max(room[w] for w in pend)
        n = node.parent
        while n is not None:
            missing = depth - n.depth
            if missing > reach:
                return None  # more than any of them may take, and growing
            if not n.holders.isdisjoint(pend):
                hit = n.holders & pend
                if any(missing <= room[w] for w in hit):
                    return missing
                pend = pend - hit
                if not pend:
                    return None
                reach = max(room[w] for w in pend)
            n = n.parent
        # The rest hold nothing of the path.
        return depth if depth <= reach else None

    # inter: r = 0 and missed > θ_inter; key (−missed/footprint, footprint, −depth, key, C)

    def _inter(self, first: int) -> Iterator[Candidate]:
        t = self.settings.theta_inter
        slots, cols = self._pairs(lambda col, c: np.flatnonzero(self.missed[col] > t))
        neg_m = -np.concatenate([self.missed[col][slots[cols == col]] for col, _ in self.columns])
        # (the concatenation above is in the order of _pairs: column by column)
        # missed/footprint ≤ missed (a footprint is ≥ 1 block), so the bound
        # (−missed,) is ≤ the key.
        stream = _lex_stream([neg_m.__getitem__], [slots, cols], first)
        for _, cand in _exact_order(stream, self._inter_key):
            yield cand

    def _inter_key(self, item: tuple[int, int]) -> tuple[tuple[Any, ...], Candidate] | None:
        slot, col = item
        node = self._node(slot)
        if node is None:
            return None
        c, key = self.mgr._degrees[col], node.key
        if not node.holders.isdisjoint(self.ids[c]) or (key, c) in self.covered:
            return None
        fp = self._footprint(node, c)
        if fp is None:
            return None
        score = self.mgr._missed[col][slot] / fp
        return (-score, fp, -node.depth, key, c), Candidate(
            "inter", key, c, 0, score, fp, node.depth
        )

    # intra: r > 0 and access > r·θ_intra; key (−band, footprint, −access/r, key, C)

    def _band(self, score: float) -> float:
        """Near-tie band of an intra score (higher is better): geometric buckets
        of width 1 + tie_tolerance; the score itself with no tolerance."""
        tol = self.settings.tie_tolerance
        return math.floor(math.log(score) / math.log1p(tol)) if tol > 0 else score

    def _intra(self, first: int) -> Iterator[Candidate]:
        t = self.settings.theta_intra
        slots, cols = self._pairs(lambda col, c: np.flatnonzero(self.access[col] > t))
        neg_a = -np.concatenate([self.access[col][slots[cols == col]] for col, _ in self.columns])
        stream = _lex_stream([neg_a.__getitem__], [slots, cols], first)
        band, tol = self._band, self.settings.tie_tolerance

        def bounded() -> Iterator[tuple[tuple[float], tuple[int, int]]]:
            # access/r is access itself for r = 1 and at most half of it
            # otherwise, so band(access/r) ≤ band(access); one band of slack
            # where access lies within rounding of a band edge. Non-decreasing.
            lowest = math.inf
            for (neg,), item in stream:
                a = -neg
                b = band(a)
                if tol > 0 and band(a * (1 + 1e-9)) != b:
                    b += 1
                lowest = min(lowest, b)
                yield (-lowest,), item

        # Two stages: replica counts (cheap) give the band; footprints (path
        # walks) are computed only for the bands read.
        banded = _exact_order(bounded(), self._intra_band)
        staged = (((key[0],), value) for key, value in banded)
        for _, cand in _exact_order(staged, self._intra_key):
            yield cand

    def _intra_band(
        self, item: tuple[int, int]
    ) -> tuple[tuple[Any, ...], tuple[TrieNode, int, int, float, float]] | None:
        slot, col = item
        node = self._node(slot)
        if node is None:
            return None
        c, key = self.mgr._degrees[col], node.key
        r = len(node.holders & self.ids[c])
        a = self.mgr._access[col][slot]
        if not r or not a > r * self.settings.theta_intra or (key, c) in self.covered:
            return None
        score = a / r
        band = self._band(score)
        return (-band, key, c), (node, c, r, score, band)

    def _intra_key(
        self, item: tuple[TrieNode, int, int, float, float]
    ) -> tuple[tuple[Any, ...], Candidate] | None:
        node, c, r, score, band = item
        fp = self._footprint(node, c)
        if fp is None:
            return None
        return (-band, fp, -score, node.key, c), Candidate(
            "intra", node.key, c, r, score, fp, node.depth
        )

    # reclaim: r ≥ reclaim_min_replicas and access < r·θ_reclaim;
    # key (access/r, −depth, key, C), lowest first

    def reclaim_head(self) -> list[Candidate]:
        """The first ``reclaim_ranked_per_scan`` reclamation candidates."""
        s = self.settings
        want = s.reclaim_ranked_per_scan
        if want <= 0:
            return []
        t, min_r = s.theta_reclaim, s.reclaim_min_replicas
        used = self.depth > 0
        most = {c: len(ws) for c, ws in self.by_degree.items()}
        bounds = []

        def select(col: int, c: int) -> np.ndarray[Any, Any]:
            if most[c] < min_r:
                sl = np.zeros(0, dtype=np.intp)
            else:
                sl = np.flatnonzero((self.access[col] < most[c] * t) & used)
            # access/r ≥ access/R_C (R_C: the degree-C workers), so the bound
            # (access/R_C, −depth, key, C) is ≤ the key.
            bounds.append(self.access[col][sl] / most[c])
            return sl

        slots, cols = self._pairs(select)
        b = np.concatenate(bounds) if bounds else np.zeros(0)
        depth, degrees = self.depth, np.array(self.mgr._degrees, dtype=np.int64)
        if self.mgr._wide_keys:
            nodes = self.mgr._nodes

            def keys(i: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
                return np.array(
                    [n.key if n is not None else 0 for n in map(nodes.__getitem__, slots[i])],
                    dtype=object,
                )
        else:
            all_keys = np.frombuffer(self.mgr._keys, dtype=np.uint64)

            def keys(i: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
                return all_keys[slots[i]]

        # Key columns are computed only where needed: for the items tied on
        # all earlier ones, and for the head.
        stream = _lex_stream(
            [b.__getitem__, lambda i: -depth[slots[i]], keys, lambda i: degrees[cols[i]]],
            [slots, cols],
            8 * want,
        )
        out = []
        for (score, neg_depth, key, c, r), _ in _exact_order(stream, self._reclaim_key):
            out.append(Candidate("reclaim", key, c, r, score, 0, -neg_depth))
            if len(out) == want:
                break
        return out

    def _reclaim_key(self, item: tuple[int, int]) -> tuple[tuple[Any, ...], None] | None:
        slot, col = item
        node = self._node(slot)
        if node is None:
            return None
        s = self.settings
        holders = node.holders
        if len(holders) < s.reclaim_min_replicas:
            return None
        c = self.mgr._degrees[col]
        r = len(holders & self.ids[c])
        a = self.mgr._access[col][slot]
        if r < s.reclaim_min_replicas or not a < r * s.theta_reclaim:
            return None
        return (a / r, -node.depth, node.key, c, r), None

    def finish(self) -> None:
        """After the selection: forget the nodes below the floor and those that
        left the trie, then decay every counter (the epoch increment is the
        caller's)."""
        mgr, s = self.mgr, self.settings
        # A node stays tracked while some counter, after this scan's decay, is
        # still above counter_floor times the threshold it could cross.
        keep_missed = s.counter_floor * s.theta_inter / s.decay
        keep_access = s.counter_floor * s.theta_intra / s.decay
        live = np.zeros(self.depth.size, dtype=bool)
        for a in self.access:
            live |= a > keep_access
        for m in self.missed:
            live |= m > keep_missed
        if self.gone:
            mgr._release_slots(sorted(self.gone), _GONE)
        # Forget in place: the node keeps its slot and counters (decayed with
        # the table below) until the slot is reused, so this is vector work only.
        drop = np.flatnonzero(~live & (self.depth > 0))
        self.depth[drop] = -self.depth[drop]
        mgr._free.extend(drop.tolist())
        for a in self.access + self.missed:
            a *= s.decay
        del self.access, self.missed, self.depth
        cap = len(mgr._nodes)
        if cap > 4096 and 4 * mgr._tracked_count() < cap:
            mgr._compact()
        elif len(mgr._free) > 2 * cap:
            # (entries of slots tracked again in place pile up otherwise)
            depth = np.frombuffer(mgr._depth, dtype=np.int64)
            mgr._free = np.flatnonzero(depth <= 0)[::-1].tolist()


_Column = Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]


def _lex_stream(
    keys: Sequence[_Column], data: Sequence[np.ndarray[Any, Any]], first: int
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """(key, data) tuples of items 0..n−1 (n = len(data[0])) in increasing
    lexicographic order of (keys[0](i), keys[1](i), …): partial selections of
    the next ``first`` items, then 4× as many and so on, rather than a full
    sort (most readers stop early). A key column maps an index array to values."""
    n = int(data[0].size)
    left = np.arange(n)
    k = max(1, first)
    taken = np.zeros(n, dtype=bool)
    while left.size:
        head = _lex_head(keys, left, k)
        yield from zip(
            zip(*[f(head).tolist() for f in keys], strict=True),
            zip(*[a[head].tolist() for a in data], strict=True),
            strict=True,
        )
        if head.size == left.size:
            return
        taken[head] = True
        left = left[~taken[left]]
        k *= 4


def _lex_head(keys: Sequence[_Column], idx: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any]:
    """The ``k`` lexicographically smallest of items ``idx`` (all if fewer), sorted.

    Selection column by column: items below the k-th value of a column are in,
    items equal to it go on to the next column, so later columns are computed
    for ties only. O(len(idx)) per column, plus sorting the head.
    """
    if idx.size > k:
        parts = []
        for f in keys:
            v = f(idx)
            low = v.min()
            if np.count_nonzero(v == low) >= k:
                kth = low  # (common: a mass of ties at the bottom, slow to partition)
            elif v.dtype == object:
                kth = np.sort(v)[k - 1]
            else:
                kth = np.partition(v, k - 1)[k - 1]
            below = v < kth
            parts.append(idx[below])
            k -= int(np.count_nonzero(below))
            idx = idx[v == kth]
            if idx.size <= k:
                break
        else:
            idx = idx[:k]  # equal in every column: any k of them
        parts.append(idx)
        idx = np.concatenate(parts)
    cols = [f(idx) for f in keys]
    if any(c.dtype == object for c in cols):
        rows = list(zip(*[c.tolist() for c in cols], strict=True))
        return idx[sorted(range(len(rows)), key=rows.__getitem__)]
    return idx[np.lexsort(cols[::-1])]


def _exact_order(
    stream: Iterable[tuple[tuple[Any, ...], _T]],
    exact: Callable[[_T], tuple[tuple[Any, ...], _V] | None],
) -> Iterator[tuple[tuple[Any, ...], _V]]:
    """(key, value) of the items of ``stream`` in increasing order of exact key.

    ``stream`` yields (bound, item) with non-decreasing bounds; ``exact(item)``
    is None (not a candidate) or (key, value) with key ≥ the item's bound, keys
    unique. A computed key below the next item's bound is below the key of
    every item not computed yet (key ≥ bound ≥ that bound), so it is next in
    the full order: the output is the full sort, while ``exact`` runs only for
    the items read plus those whose bound does not exceed the last key read.
    """
    heap: list[tuple[tuple[Any, ...], _V]] = []
    for bound, item in stream:
        while heap and heap[0][0] < bound:
            yield heapq.heappop(heap)
        found = exact(item)
        if found is not None:
            heapq.heappush(heap, found)
    while heap:
        yield heapq.heappop(heap)
