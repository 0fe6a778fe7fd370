"""Prometheus metrics of one router replica, named after what users of the peers already read.

Counters and histograms are updated as things happen; per-worker gauges
(q_w, queue length, reachability) and the cache-event counts of the
followers come from a snapshot the router takes on its event loop once a
second (``/metrics`` is served from another thread, which must not touch the
live state). Each router has its own registry (no module state); ``serve``
exposes it on ``/metrics`` of a separate port.

=====================================================  ==================================================
metric                                                 peers' counterpart
=====================================================  ==================================================
``vertumnus_router_ttft_seconds``                      ``smg_router_ttft_seconds``,
                                                       ``llm_d_epp_request_ttft_seconds``
``vertumnus_router_placement_seconds``                 ``llm_d_epp_scheduler_e2e_duration_seconds``
``vertumnus_router_requests_total{outcome}``           ``smg_router_requests_total``
``vertumnus_worker_outstanding_seconds{worker,degree}`` ``dynamo_frontend_worker_active_prefill_tokens``
``vertumnus_worker_queue_length{worker,degree}``       ``sglang:num_queue_reqs``, ``smg_worker_requests_active``
``vertumnus_router_cache_hit_tokens_total``            ``llm_d_epp_kv_cache_index_lookup_hits_total``
``vertumnus_router_prompt_tokens_total``               (with the above: the token hit rate,
                                                       ``dynamo_component_router_kv_hit_rate``)
``vertumnus_cache_manager_{copies,reclaims}_total``    —
``vertumnus_reconfigurations_total{kind}``,            —
``vertumnus_reconfiguration_{drain,switch,total}_seconds``
``vertumnus_cache_events_{events,gaps,resyncs,drops}`` —
``vertumnus_process_gc_pause_seconds{generation}``     —
=====================================================  ==================================================
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from vertumnus.gcpauses import CollectorPauses

if TYPE_CHECKING:
    from vertumnus.router.router import PrefillResult, Router

__all__ = ["RouterMetrics"]

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
_FAST_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
_RECONF_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_GC_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class RouterMetrics:
    """The metrics of one router; ``registry`` is what ``/metrics`` serves."""

    def __init__(self, router_id: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._ttft = Histogram(
            "vertumnus_router_ttft_seconds",
            "Router receipt to first token.",
            ["degree"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self._placement = Histogram(
            "vertumnus_router_placement_seconds",
            "Validation, admission and placement of one request.",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self._slo = Counter(
            "vertumnus_router_slo_requests",
            "Completed requests that set a TTFT target, by whether they met it.",
            ["met"],
            registry=r,
        )
        self._outcomes = Counter(
            "vertumnus_router_requests", "Requests by outcome.", ["outcome"], registry=r
        )
        self._attempt_failures = Counter(
            "vertumnus_router_attempt_failures",
            "Attempts a worker failed, by status.",
            ["worker", "code"],
            registry=r,
        )
        self._hit_tokens = Counter(
            "vertumnus_router_cache_hit_tokens",
            "Prompt tokens served from a worker's cache.",
            registry=r,
        )
        self._prompt_tokens = Counter(
            "vertumnus_router_prompt_tokens", "Prompt tokens of completed requests.", registry=r
        )
        self._reconciled = Counter(
            "vertumnus_router_reconciled_blocks",
            "Pending blocks copied before a prefill reused them.",
            registry=r,
        )
        self._copies = Counter(
            "vertumnus_cache_manager_copies",
            "Cache-manager copies finished, by result.",
            ["result"],
            registry=r,
        )
        self._reclaims = Counter(
            "vertumnus_cache_manager_reclaims",
            "Cache-manager reclamations finished, by result.",
            ["result"],
            registry=r,
        )
        self._scans = Counter("vertumnus_cache_manager_scans", "Cache-manager scans.", registry=r)
        self._moved = Counter(
            "vertumnus_router_requests_moved",
            "Queued requests placed on another worker when capacity joined the pool "
            "(a commit's new workers, a drained worker resumed).",
            registry=r,
        )
        self._reconfigs = Counter(
            "vertumnus_reconfigurations", "Splits and merges committed.", ["kind"], registry=r
        )
        self._admin_refused = Counter(
            "vertumnus_router_admin_refused",
            "Admin calls refused for want of the pool's admin token, by method.",
            ["method"],
            registry=r,
        )
        self._reconf_drain = Histogram(
            "vertumnus_reconfiguration_drain_seconds",
            "Drain part of a split or merge.",
            ["kind"],
            buckets=_RECONF_BUCKETS,
            registry=r,
        )
        self._reconf_switch = Histogram(
            "vertumnus_reconfiguration_switch_seconds",
            "Engine epoch switch of a split or merge.",
            ["kind"],
            buckets=_RECONF_BUCKETS,
            registry=r,
        )
        self._reconf_total = Histogram(
            "vertumnus_reconfiguration_total_seconds",
            "A split or merge end to end.",
            ["kind"],
            buckets=_RECONF_BUCKETS,
            registry=r,
        )
        self._controller = Histogram(
            "vertumnus_controller_decision_seconds",
            "The composition controller's time per window.",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self._whatif = Counter(
            "vertumnus_controller_whatif",
            "The controller's what-if check per window, by verdict (agree, extend, veto, "
            "trigger, wait, stay).",
            ["verdict"],
            registry=r,
        )
        self._kappa = Gauge(
            "vertumnus_controller_kappa",
            "κ per degree the controller's rules read: seconds of predicted prefill work per "
            "second one worker sustains at the SLO target (the shipped profile, or its online "
            "correction with learn_capacity).",
            ["degree"],
            registry=r,
        )
        self._gc_pause = Histogram(
            "vertumnus_process_gc_pause_seconds",
            "Each collection of Python's cyclic garbage collector in this process, by "
            "generation (2: a full one), while the router runs: every decision waits for it.",
            ["generation"],
            buckets=_GC_BUCKETS,
            registry=r,
        )
        self.gc_pauses = CollectorPauses()
        """Timed by the router from its start to its close; drained at each snapshot."""
        self._state = _StateCollector()
        r.register(self._state)
        self.placement_samples: deque[float] = deque(maxlen=100_000)
        """The most recent placement times, exact (the histogram's buckets are coarse):
        what ``bench/router_overhead.py`` reads its percentiles from."""

    # -- events ---------------------------------------------------------------------

    def snapshot(self, router: Router) -> None:
        """Take the gauges' values from the router (on its event loop)."""
        for generation, seconds in self.gc_pauses.drain():
            self._gc_pause.labels(str(generation)).observe(seconds)
        core = router.core
        if core is None:
            return
        core.refresh(router.now())
        workers = tuple(
            (
                state.id,
                state.degree,
                state.outstanding_s,
                state.queued,
                0.0 if (w := router.workers.get(state.id)) is None or w.unreachable else 1.0,
            )
            for state in core.workers
        )
        followers = tuple(
            (
                wid,
                f.counts.events,
                f.counts.gaps,
                f.counts.resyncs,
                f.counts.drops,
                f.counts.reconnects,
            )
            for wid, f in router.followers.items()
        )
        epoch = router.pool.epoch if router.pool is not None else 0
        self._state.values = _Snapshot(
            workers, epoch, router.in_flight(), len(router.store), followers
        )

    def placement_seconds(self, seconds: float) -> None:
        self._placement.observe(seconds)
        self.placement_samples.append(seconds)

    def outcome(self, outcome: str) -> None:
        self._outcomes.labels(outcome).inc()

    def completed(
        self, result: PrefillResult, degree: int, cached: int, prompt: int, slo_s: float = 0.0
    ) -> None:
        self._ttft.labels(str(degree)).observe(result.ttft_seconds)
        if slo_s > 0:
            self._slo.labels("true" if result.ttft_seconds <= slo_s else "false").inc()
        self._outcomes.labels("ok").inc()
        self._hit_tokens.inc(cached)
        self._prompt_tokens.inc(prompt)

    def admin_refused(self, method: str) -> None:
        self._admin_refused.labels(method=method).inc()

    def attempt_failed(self, worker: int, code: str) -> None:
        self._attempt_failures.labels(str(worker), code).inc()

    def worker_reachable(self, worker: int, reachable: bool) -> None:
        pass  # read from the router's state at scrape time

    def reconciled(self, blocks: int) -> None:
        self._reconciled.inc(blocks)

    def scan(self, copies: int, reclaims: int) -> None:
        self._scans.inc()

    def copy_done(self, ok: bool) -> None:
        self._copies.labels("installed" if ok else "failed").inc()

    def reclaim_done(self, ok: bool) -> None:
        self._reclaims.labels("deleted" if ok else "refused").inc()

    def moved(self, requests: int) -> None:
        self._moved.inc(requests)

    def transition_started(self, kind: str) -> None:
        pass

    def transition_done(self, kind: str, drain_s: float, switch_s: float, total_s: float) -> None:
        self._reconfigs.labels(kind).inc()
        self._reconf_drain.labels(kind).observe(drain_s)
        self._reconf_switch.labels(kind).observe(switch_s)
        self._reconf_total.labels(kind).observe(total_s)

    def controller_seconds(self, seconds: float) -> None:
        self._controller.observe(seconds)

    def whatif_verdict(self, verdict: str) -> None:
        self._whatif.labels(verdict).inc()

    def kappa(self, per_degree: Mapping[int, float]) -> None:
        for degree, k in per_degree.items():
            self._kappa.labels(str(degree)).set(k)


@dataclass(frozen=True)
class _Snapshot:
    workers: tuple[tuple[int, int, float, int, float], ...]
    """(worker, degree, q_w, queued, reachable)"""
    epoch: int
    in_flight: int
    index_blocks: int
    followers: tuple[tuple[int, int, int, int, int, int], ...]
    """(worker, events, gaps, resyncs, drops, reconnects)"""


class _StateCollector(Collector):
    """Per-worker gauges and the followers' counts, from the router's last snapshot."""

    def __init__(self) -> None:
        self.values: _Snapshot | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self.values
        if snap is None:
            return
        outstanding = GaugeMetricFamily(
            "vertumnus_worker_outstanding_seconds",
            "q_w: predicted work queued or running.",
            labels=["worker", "degree"],
        )
        queue = GaugeMetricFamily(
            "vertumnus_worker_queue_length",
            "Requests placed at the worker and not started.",
            labels=["worker", "degree"],
        )
        reachable = GaugeMetricFamily(
            "vertumnus_worker_reachable", "1 while the worker answers.", labels=["worker", "degree"]
        )
        for wid, degree, q, queued, up in snap.workers:
            labels = [str(wid), str(degree)]
            outstanding.add_metric(labels, q)
            queue.add_metric(labels, queued)
            reachable.add_metric(labels, up)
        yield outstanding
        yield queue
        yield reachable
        epoch = GaugeMetricFamily("vertumnus_pool_epoch", "The pool's configuration epoch.")
        epoch.add_metric([], float(snap.epoch))
        yield epoch
        inflight = GaugeMetricFamily(
            "vertumnus_router_requests_in_flight", "Accepted, not finished."
        )
        inflight.add_metric([], float(snap.in_flight))
        yield inflight
        blocks = GaugeMetricFamily("vertumnus_index_blocks", "Blocks in the global prefix index.")
        blocks.add_metric([], float(snap.index_blocks))
        yield blocks
        names = (
            ("events", "Cache events applied."),
            ("gaps", "Sequence gaps (and RESYNC answers) detected."),
            ("resyncs", "Snapshots taken to rebuild a worker's index entries."),
            ("drops", "Times a worker's entries were dropped (restart, clear, gone)."),
            ("reconnects", "Event streams lost and reconnected."),
        )
        families = [
            CounterMetricFamily(f"vertumnus_cache_events_{name}", text, labels=["worker"])
            for name, text in names
        ]
        for row in snap.followers:
            for fam, value in zip(families, row[1:], strict=True):
                fam.add_metric([str(row[0])], float(value))
        yield from families
