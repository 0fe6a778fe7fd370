"""The operator's Prometheus metrics: every CPPool it runs, labelled ``namespace`` and ``pool``.

``python -m vertumnus.operator run --metrics-listen 0.0.0.0:9464`` serves them on
``/metrics``. The controller and transition metrics carry the names the router exports
when it runs the controller itself (the local pool, ``vertumnus up``), so one dashboard
and one alert read both; under the operator the routers export none of them.

=====================================================  ==========================================
metric                                                 what
=====================================================  ==========================================
``vertumnus_pool_epoch``                               the pool's configuration epoch
``vertumnus_operator_pool_workers{degree}``            workers per CP degree (the composition)
``vertumnus_operator_pool_composition_info{composition}``  1, labelled ``4xCP4+3xCP8``
``vertumnus_operator_pool_phase{phase}``               1 for the status phase, 0 for the others
``vertumnus_operator_pool_gpus``, ``..._ready_gpus``   the GPUs its workers hold, those of ready domain pods
``vertumnus_operator_pool_transitions_in_flight``      splits, merges, replacements in flight
``vertumnus_operator_pool_outdated_pods``              domain pods running an older spec
``vertumnus_operator_pool_problem{condition,reason}``  1 per problem the conditions report
``vertumnus_reconfigurations_total{kind}``             transitions committed (split, merge, replace)
``vertumnus_reconfiguration_{drain,switch,total}_seconds{kind}``  their parts, from the record
``vertumnus_controller_decision_seconds``              one look of the controller (wall)
``vertumnus_controller_whatif_total{verdict}``         the what-if check's verdicts
``vertumnus_controller_kappa{degree}``                 κ the controller's rules read
``vertumnus_operator_domain_pods_replaced_total``      domain pods a rolling update replaced
``vertumnus_operator_domain_update_seconds``           one domain's update, first drain to resume
``vertumnus_operator_step_errors_total{error}``        reconcile steps that failed, by exception
``vertumnus_operator_watch_failures_total{collection}``  watches of its pods/endpointslices that broke
``vertumnus_operator_api_requests_total{verb,resource}``  the operator's API requests (no pool label)
``vertumnus_process_gc_pause_seconds{generation}``     the operator process's collector pauses
=====================================================  ==========================================

A pool's series go when its loop stops (the CPPool deleted, or this replica paused for a
peer that now runs it), so a dashboard never shows a pool twice or one that is gone.
Each pool updates its own :class:`PoolMetrics` from its loop; ``/metrics`` is served from
another thread, so every read and write takes the registry's lock (a few per step).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from vertumnus.gcpauses import CollectorPauses
from vertumnus.operator.status import PHASES, Problem

__all__ = ["OperatorMetrics", "PoolMetrics"]

DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
RECONF_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
UPDATE_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
GC_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


@dataclass
class _Buckets:
    """One histogram series: counts per bucket (not cumulative), their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.total += value

    def copy(self) -> _Buckets:
        return _Buckets(self.bounds, list(self.counts), self.total)

    def cumulative(self) -> list[tuple[str, float]]:
        counts = self.counts or [0] * (len(self.bounds) + 1)
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            out.append((floatToGoString(bound), float(running)))
        return out


@dataclass
class _Gauges:
    """What a pool's status said last (its gauges)."""

    epoch: int = 0
    workers: dict[int, int] = field(default_factory=dict)
    composition: str = ""
    phase: str = ""
    ready_gpus: int = 0
    in_flight: int = 0
    outdated: int = 0
    problems: dict[tuple[str, str], int] = field(default_factory=dict)
    kappa: dict[int, float] = field(default_factory=dict)
    object_bytes: int = 0


class PoolMetrics:
    """One CPPool's series. Built by :meth:`OperatorMetrics.pool`; every method is cheap
    and safe from the pool's loop or the controller's thread."""

    def __init__(self, owner: OperatorMetrics, namespace: str, name: str) -> None:
        self._owner = owner
        self._lock = owner.lock
        self.labels = (namespace, name)
        self.gauges = _Gauges()
        self.counters: dict[tuple[str, str], float] = {}
        """(metric, label value) → count."""
        self.histograms: dict[tuple[str, str], _Buckets] = {}
        """(metric, label value) → buckets."""

    def _count(self, metric: str, label: str = "") -> None:
        self.counters[metric, label] = self.counters.get((metric, label), 0.0) + 1.0

    def _observe(self, metric: str, value: float, label: str = "") -> None:
        series = self.histograms.get((metric, label))
        if series is None:
            series = self.histograms[metric, label] = _Buckets(_HISTOGRAMS[metric][2])
        series.observe(max(0.0, value))

    # ---- what the pool's loop reports ------------------------------------------------------

    def status(self, view: Mapping[str, Any], problems: Sequence[Problem]) -> None:
        """The gauges from the status just rendered (:func:`~vertumnus.operator.status.
        build_status`) and the problems its conditions came from."""
        outdated = int(view.get("domains") or 0) - int(view.get("updatedDomains") or 0)
        workers: dict[int, int] = {}
        for w in view.get("workers") or ():
            workers[int(w["degree"])] = workers.get(int(w["degree"]), 0) + 1
        found: dict[tuple[str, str], int] = {}
        for p in problems:
            found[p.condition, p.reason] = found.get((p.condition, p.reason), 0) + 1
        with self._lock:
            g = self.gauges
            g.epoch = int(view.get("epoch") or 0)
            g.workers = workers
            g.composition = str(view.get("composition") or "")
            g.phase = str(view.get("phase") or "")
            g.ready_gpus = int(view.get("readyGPUs") or 0)
            g.in_flight = len(view.get("transitions") or ())
            g.outdated = outdated
            g.problems = found

    def written(self, object_bytes: int) -> None:
        """A status write succeeded: the CPPool it returned is ``object_bytes`` of JSON."""
        with self._lock:
            self.gauges.object_bytes = object_bytes

    def decided(
        self, seconds: float, verdict: str | None, kappa: Mapping[int, float] | None
    ) -> None:
        """One look of the controller: its wall time, the what-if verdict (None: no check
        this hop), the κ its rules read."""
        with self._lock:
            self._observe("vertumnus_controller_decision_seconds", seconds)
            if verdict is not None:
                self._count("vertumnus_controller_whatif", verdict)
            if kappa is not None:
                self.gauges.kappa = {int(d): float(k) for d, k in kappa.items()}

    def committed(self, kind: str, drain_s: float, switch_s: float, total_s: float) -> None:
        """A transition committed, with its parts as recorded."""
        with self._lock:
            self._count("vertumnus_reconfigurations", kind)
            for part, seconds in (("drain", drain_s), ("switch", switch_s), ("total", total_s)):
                self._observe(f"vertumnus_reconfiguration_{part}_seconds", seconds, kind)

    def domain_replaced(self, seconds: float) -> None:
        """A rolling update replaced a domain pod, ``seconds`` from its first drain."""
        with self._lock:
            self._count("vertumnus_operator_domain_pods_replaced")
            self._observe("vertumnus_operator_domain_update_seconds", seconds)

    def step_failed(self, error: str) -> None:
        with self._lock:
            self._count("vertumnus_operator_step_errors", error)

    def watch_failed(self, collection: str) -> None:
        """A watch of the pool's ``pods`` or ``endpointslices`` broke (the loop lists them
        until it is back)."""
        with self._lock:
            self._count("vertumnus_operator_watch_failures", collection)

    def forget(self) -> None:
        """Drop the pool's series (its loop stopped)."""
        self._owner.forget(self)


@dataclass(frozen=True)
class _Copy:
    """A pool's series as one scrape renders them."""

    labels: tuple[str, str]
    gauges: _Gauges
    counters: dict[tuple[str, str], float]
    histograms: dict[tuple[str, str], _Buckets]

    @staticmethod
    def of(pool: PoolMetrics) -> _Copy:
        """Under the lock. The gauges' dicts are replaced, never changed in place, so a
        shallow copy of them stays as it was."""
        return _Copy(
            pool.labels,
            copy.copy(pool.gauges),
            dict(pool.counters),
            {k: b.copy() for k, b in pool.histograms.items()},
        )


_COUNTERS = {
    # metric: (help, label name or "" for none)
    "vertumnus_reconfigurations": ("Splits, merges and replacements committed.", "kind"),
    "vertumnus_controller_whatif": (
        "The controller's what-if check per look, by verdict (agree, extend, veto, trigger, "
        "wait, stay, damped, hold, recall).",
        "verdict",
    ),
    "vertumnus_operator_domain_pods_replaced": (
        "Domain pods a rolling update replaced.",
        "",
    ),
    "vertumnus_operator_step_errors": (
        "Steps of a pool's loop that failed (retried with backoff), by exception.",
        "error",
    ),
    "vertumnus_operator_watch_failures": (
        "Watches of the pool's domain pods or router EndpointSlices that broke; until one "
        "is back, the pool's loop lists that collection at every step.",
        "collection",
    ),
}
_HISTOGRAMS = {
    # metric: (help, label name or "" for none, buckets)
    "vertumnus_controller_decision_seconds": (
        "The composition controller's time per look (wall, with the what-if check).",
        "",
        DECISION_BUCKETS,
    ),
    "vertumnus_reconfiguration_drain_seconds": (
        "Drain part of a transition.",
        "kind",
        RECONF_BUCKETS,
    ),
    "vertumnus_reconfiguration_switch_seconds": (
        "Switch part of a transition (the engines' regroup).",
        "kind",
        RECONF_BUCKETS,
    ),
    "vertumnus_reconfiguration_total_seconds": (
        "A transition end to end.",
        "kind",
        RECONF_BUCKETS,
    ),
    "vertumnus_operator_domain_update_seconds": (
        "One domain pod's rolling update, from its first drain to its workers resumed.",
        "",
        UPDATE_BUCKETS,
    ),
}


class OperatorMetrics(Collector):
    """The operator's registry (``registry``, what ``/metrics`` serves) and its pools."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._pools: dict[tuple[str, str], PoolMetrics] = {}
        self._gc_by_generation: dict[int, _Buckets] = {}
        self.gc_pauses = CollectorPauses()
        """Timed while ``/metrics`` is served (:meth:`serve`); drained at each scrape."""
        self._server: Any = None
        self.api_requests: Mapping[tuple[str, str], int] | None = None
        """The operator's API requests by (verb, resource) (its KubeClient's ``requests``),
        set once the client exists."""
        self.crd_current: bool | None = None
        """The installed CPPool CRD is this operator's (:mod:`.crdcheck`); None: not
        compared yet."""
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def serve(self, listen: str) -> int:
        """Serve ``/metrics`` on ``listen`` (HOST:PORT; port 0 picks one) from a thread,
        and time the process's collections from now on; the port. ValueError names what
        is wrong with ``listen``."""
        host, _, port = listen.rpartition(":")
        try:
            server, _thread = start_http_server(
                int(port), addr=host or "0.0.0.0", registry=self.registry
            )
        except (OSError, OverflowError, ValueError) as e:
            raise ValueError(f"cannot serve metrics on {listen!r}: {e}") from None
        self._server = server
        self.gc_pauses.start()
        return int(server.server_port)

    def close(self) -> None:
        """Stop serving and timing (idempotent)."""
        self.gc_pauses.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def pool(self, namespace: str, name: str) -> PoolMetrics:
        """The series of one pool; a second call for the same pool replaces the first
        (a pool's loop restarted after a pause starts from zero, as a restarted process does)."""
        m = PoolMetrics(self, namespace, name)
        with self.lock:
            self._pools[namespace, name] = m
        return m

    def forget(self, pool: PoolMetrics) -> None:
        with self.lock:
            if self._pools.get(pool.labels) is pool:
                del self._pools[pool.labels]

    # ---- the scrape ------------------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        return ()  # no fixed set of series: the collector is not probed at registration

    def collect(self) -> Iterator[Metric]:
        # Copied under the lock, rendered outside it: a scrape of many pools takes tens
        # of ms, which no pool's loop (nor a controller's look) should wait for.
        with self.lock:
            for generation, seconds in self.gc_pauses.drain():
                series = self._gc_by_generation.setdefault(generation, _Buckets(GC_BUCKETS))
                series.observe(seconds)
            pools = [_Copy.of(p) for p in self._pools.values()]
            gc = {g: b.copy() for g, b in self._gc_by_generation.items()}
        # Counted on the operator's event loop; a dict copy is one step under the GIL.
        requests = dict(self.api_requests or {})
        yield from self._families(pools, gc)
        api = CounterMetricFamily(
            "vertumnus_operator_api_requests",
            "The operator's requests to the Kubernetes API server, by verb and resource "
            "(a watch counts when it starts).",
            labels=["verb", "resource"],
        )
        for (verb, resource), count in sorted(requests.items()):
            api.add_metric([verb, resource], count)
        yield api
        crd = GaugeMetricFamily(
            "vertumnus_operator_crd_current",
            "1 when the installed CPPool CRD is the one this operator ships, 0 when it differs "
            "(helm upgrade does not upgrade CRDs: the API server drops the fields an older "
            "schema lacks); absent until compared.",
        )
        if self.crd_current is not None:
            crd.add_metric([], 1.0 if self.crd_current else 0.0)
        yield crd

    def _families(self, pools: list[_Copy], gc_series: dict[int, _Buckets]) -> Iterator[Metric]:
        base = ["namespace", "pool"]

        def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*base, *extra])

        epoch = gauge("vertumnus_pool_epoch", "The pool's configuration epoch.")
        workers = gauge("vertumnus_operator_pool_workers", "Workers per CP degree.", ["degree"])
        info = gauge(
            "vertumnus_operator_pool_composition_info",
            "1, labelled with the pool's composition (e.g. 4xCP4+3xCP8).",
            ["composition"],
        )
        phase = gauge(
            "vertumnus_operator_pool_phase",
            "1 for the pool's status phase, 0 for the others.",
            ["phase"],
        )
        gpus = gauge("vertumnus_operator_pool_gpus", "GPUs the pool's workers hold.")
        ready = gauge("vertumnus_operator_pool_ready_gpus", "GPUs of the ready domain pods.")
        in_flight = gauge(
            "vertumnus_operator_pool_transitions_in_flight",
            "Splits, merges and replacements in flight.",
        )
        outdated = gauge(
            "vertumnus_operator_pool_outdated_pods", "Domain pods that run an older spec."
        )
        problem = gauge(
            "vertumnus_operator_pool_problem",
            "Problems the pool's conditions report (Degraded, Progressing, Ready=False, "
            "GangScheduled=False), by condition and reason.",
            ["condition", "reason"],
        )
        size = gauge(
            "vertumnus_operator_pool_object_bytes",
            "The CPPool's size as JSON after the operator's last status write (etcd refuses "
            "an object over its request limit, 1.5 MB by default; then no status write "
            "succeeds).",
        )
        kappa = gauge(
            "vertumnus_controller_kappa",
            "κ per degree the controller's rules read: seconds of predicted prefill work per "
            "second one worker sustains at the SLO target.",
            ["degree"],
        )
        for p in pools:
            g, ls = p.gauges, list(p.labels)
            epoch.add_metric(ls, g.epoch)
            for degree, n in sorted(g.workers.items()):
                workers.add_metric([*ls, str(degree)], n)
            if g.composition:
                info.add_metric([*ls, g.composition], 1)
            if g.phase:
                for ph in PHASES if g.phase in PHASES else (*PHASES, g.phase):
                    phase.add_metric([*ls, ph], 1.0 if ph == g.phase else 0.0)
            gpus.add_metric(ls, sum(degree * n for degree, n in g.workers.items()))
            ready.add_metric(ls, g.ready_gpus)
            in_flight.add_metric(ls, g.in_flight)
            outdated.add_metric(ls, g.outdated)
            if g.object_bytes:
                size.add_metric(ls, g.object_bytes)
            for (cond, reason), n in sorted(g.problems.items()):
                problem.add_metric([*ls, cond, reason], n)
            for degree, k in sorted(g.kappa.items()):
                kappa.add_metric([*ls, str(degree)], k)
        yield from (
            epoch,
            workers,
            info,
            phase,
            gpus,
            ready,
            in_flight,
            outdated,
            size,
            problem,
            kappa,
        )

        for name, (doc, label) in _COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=[*base, *([label] if label else [])])
            for p in pools:
                for (metric, value), count in sorted(p.counters.items()):
                    if metric == name:
                        counter.add_metric([*p.labels, *([value] if label else [])], count)
            yield counter
        for name, (doc, label, _) in _HISTOGRAMS.items():
            hist = HistogramMetricFamily(name, doc, labels=[*base, *([label] if label else [])])
            for p in pools:
                for (metric, value), series in sorted(p.histograms.items()):
                    if metric == name:
                        hist.add_metric(
                            [*p.labels, *([value] if label else [])],
                            series.cumulative(),
                            series.total,
                        )
            yield hist
        gc = HistogramMetricFamily(
            "vertumnus_process_gc_pause_seconds",
            "Each collection of Python's cyclic garbage collector in the operator, by "
            "generation (2: a full one): a controller look waits for it.",
            labels=["generation"],
        )
        for generation, series in sorted(gc_series.items()):
            gc.add_metric([str(generation)], series.cumulative(), series.total)
        yield gc
