"""Settings of the global prefix-cache manager (design.md section 6).

Shared by :mod:`vertumnus.core.cachemanager` (requests, selection, operations
in flight) and :mod:`vertumnus.core.cacheranking` (the ranked lists), which
both import it, so neither imports the other's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheManagerSettings"]


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
    """A block stops being tracked (and its counters count as zero) once every
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
