"""The operator's Prometheus metrics: what a scrape of ``/metrics`` reads, per pool.

Every check goes through the text exposition format and Prometheus' own parser (a real
HTTP scrape in one of them), so what is asserted is what a Prometheus server would store.
"""

from __future__ import annotations

import gc
import urllib.request
from dataclasses import replace

import pytest

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.lattice import layout_for
from vertumnus.core.types import Composition
from vertumnus.operator.__main__ import _serve_metrics
from vertumnus.operator.metrics import OperatorMetrics
from vertumnus.operator.record import Record
from vertumnus.operator.status import PHASES, Observation, Problem, build_status

from .promtext import parse, scrape, series, value


def _view(text: str, obs: Observation) -> dict:
    record = Record(tr.initial_pool(layout_for(Composition.parse(text), 8)))
    return build_status(record, obs, [], 1000.0)


def test_a_pools_gauges_follow_its_status():
    metrics = OperatorMetrics()
    pool = metrics.pool("team-a", "prefill")
    obs = Observation(domains=4, pods=4, bound=4, ready_domains={0, 1, 2}, outdated=1)
    lost = Problem("Degraded", "DomainLost", "1 of 4 domain pods are not ready")
    obs.problems = [lost]
    view = _view("4xCP4+1xCP8+2xCP4", obs)
    pool.status(view, obs.problems)

    s = scrape(metrics)
    at = {"namespace": "team-a", "pool": "prefill"}
    assert value(s, "vertumnus_pool_epoch", **at) == 1
    assert value(s, "vertumnus_operator_pool_workers", **at, degree="4") == 6
    assert value(s, "vertumnus_operator_pool_workers", **at, degree="8") == 1
    assert value(s, "vertumnus_operator_pool_gpus", **at) == 32
    assert value(s, "vertumnus_operator_pool_ready_gpus", **at) == 24
    assert view["updatedDomains"] == 3
    assert value(s, "vertumnus_operator_pool_outdated_pods", **at) == 1
    assert value(s, "vertumnus_operator_pool_transitions_in_flight", **at) == 0
    composition = view["composition"]
    assert value(s, "vertumnus_operator_pool_composition_info", **at, composition=composition) == 1
    assert (
        value(s, "vertumnus_operator_pool_problem", **at, condition="Degraded", reason="DomainLost")
        == 1
    )
    # One series per phase, 1 for the status's (kube-state-metrics' habit: alerts can test == 0).
    phases = {
        p["phase"]: value(s, "vertumnus_operator_pool_phase", **p)
        for p in series(s, "vertumnus_operator_pool_phase")
    }
    assert set(phases) == set(PHASES)
    assert [p for p, v in phases.items() if v == 1] == [view["phase"]] == ["Degraded"]

    # The problem gone, the gauges follow: no stale series.
    obs.problems = []
    obs.ready_domains = {0, 1, 2, 3}
    obs.outdated = 0
    pool.status(_view("4xCP4+1xCP8+2xCP4", obs), [])
    s = scrape(metrics)
    assert series(s, "vertumnus_operator_pool_problem") == []
    assert value(s, "vertumnus_operator_pool_ready_gpus", **at) == 32
    assert value(s, "vertumnus_operator_pool_phase", **at, phase="Ready") == 1
    assert value(s, "vertumnus_operator_pool_outdated_pods", **at) == 0
    # The CPPool's size is known once a status write returned it (StatusStore.written).
    assert series(s, "vertumnus_operator_pool_object_bytes") == []
    pool.written(10_312)
    assert value(scrape(metrics), "vertumnus_operator_pool_object_bytes", **at) == 10_312


def test_a_transition_in_flight_counts_and_shows_its_phase():
    metrics = OperatorMetrics()
    pool = metrics.pool("ns", "p")
    record = Record(tr.initial_pool(layout_for(Composition.parse("2xCP8"), 8)))
    state, _t, _ = tr.begin(record.pool, planner.Split(0, "test"))
    view = build_status(
        replace(record, pool=state), Observation(domains=2, ready_domains={0, 1}), [], 0.0
    )
    pool.status(view, [])
    s = scrape(metrics)
    assert value(s, "vertumnus_operator_pool_transitions_in_flight", namespace="ns", pool="p") == 1
    assert (
        value(s, "vertumnus_operator_pool_phase", namespace="ns", pool="p", phase="Draining") == 1
    )


def test_counters_and_histograms_per_pool():
    metrics = OperatorMetrics()
    a, b = metrics.pool("ns", "a"), metrics.pool("ns", "b")
    a.decided(0.004, "stay", {4: 0.9, 8: 1.7})
    a.decided(0.030, "agree", None)
    a.decided(0.002, None, None)  # a look without the what-if check
    a.committed("split", 0.5, 0.2, 0.7)
    b.committed("merge", 3.0, 1.0, 4.0)
    b.committed("merge", 0.01, 0.01, 0.02)
    b.domain_replaced(42.0)
    b.step_failed("AdminError")
    b.watch_failed("pods")
    b.watch_failed("pods")
    metrics.api_requests = {("list", "pods"): 3, ("watch", "pods"): 1}

    s = scrape(metrics)
    at_a, at_b = {"namespace": "ns", "pool": "a"}, {"namespace": "ns", "pool": "b"}
    assert value(s, "vertumnus_controller_decision_seconds_count", **at_a) == 3
    assert value(s, "vertumnus_controller_decision_seconds_sum", **at_a) == pytest.approx(0.036)
    # Cumulative buckets: 0.002 and 0.004 under 5 ms, 0.030 under 50 ms.
    assert value(s, "vertumnus_controller_decision_seconds_bucket", **at_a, le="0.001") == 0
    assert value(s, "vertumnus_controller_decision_seconds_bucket", **at_a, le="0.005") == 2
    assert value(s, "vertumnus_controller_decision_seconds_bucket", **at_a, le="0.025") == 2
    assert value(s, "vertumnus_controller_decision_seconds_bucket", **at_a, le="0.05") == 3
    assert value(s, "vertumnus_controller_decision_seconds_bucket", **at_a, le="+Inf") == 3
    assert value(s, "vertumnus_controller_decision_seconds_count", **at_b) is None
    assert value(s, "vertumnus_controller_whatif_total", **at_a, verdict="stay") == 1
    assert value(s, "vertumnus_controller_whatif_total", **at_a, verdict="agree") == 1
    assert len(series(s, "vertumnus_controller_whatif_total")) == 2
    assert value(s, "vertumnus_controller_kappa", **at_a, degree="8") == 1.7
    assert value(s, "vertumnus_reconfigurations_total", **at_a, kind="split") == 1
    assert value(s, "vertumnus_reconfigurations_total", **at_b, kind="merge") == 2
    assert value(
        s, "vertumnus_reconfiguration_drain_seconds_sum", **at_b, kind="merge"
    ) == pytest.approx(3.01)
    assert (
        value(s, "vertumnus_reconfiguration_total_seconds_bucket", **at_b, kind="merge", le="5.0")
        == 2
    )
    assert (
        value(s, "vertumnus_reconfiguration_total_seconds_bucket", **at_b, kind="merge", le="1.0")
        == 1
    )
    assert value(s, "vertumnus_operator_domain_pods_replaced_total", **at_b) == 1
    assert value(s, "vertumnus_operator_domain_update_seconds_bucket", **at_b, le="60.0") == 1
    assert value(s, "vertumnus_operator_domain_update_seconds_bucket", **at_b, le="30.0") == 0
    assert value(s, "vertumnus_operator_step_errors_total", **at_b, error="AdminError") == 1
    assert value(s, "vertumnus_operator_watch_failures_total", **at_b, collection="pods") == 2
    # The operator's own API requests: one series per (verb, resource), no pool label.
    assert value(s, "vertumnus_operator_api_requests_total", verb="list", resource="pods") == 3
    assert value(s, "vertumnus_operator_api_requests_total", verb="watch", resource="pods") == 1


def test_a_stopped_pool_leaves_no_series_and_a_restarted_one_starts_afresh():
    metrics = OperatorMetrics()
    old = metrics.pool("ns", "p")
    old.committed("split", 0.1, 0.1, 0.2)
    other = metrics.pool("ns", "q")
    other.committed("merge", 0.1, 0.1, 0.2)
    new = metrics.pool("ns", "p")  # the loop restarted (the replica resumed after a pause)
    old.forget()  # the old loop's cleanup runs late: it must not take the new one's series
    s = scrape(metrics)
    assert (
        value(s, "vertumnus_reconfigurations_total", namespace="ns", pool="p", kind="split") is None
    )
    new.committed("merge", 0.1, 0.1, 0.2)
    other.forget()
    s = scrape(metrics)
    assert [x["pool"] for x in series(s, "vertumnus_reconfigurations_total")] == ["p"]
    new.forget()
    assert series(scrape(metrics), "vertumnus_reconfigurations_total") == []


def test_metrics_are_served_over_http_with_the_collectors_pauses():
    metrics = OperatorMetrics()
    port = metrics.serve("127.0.0.1:0")
    try:
        metrics.pool("ns", "p").decided(0.01, "stay", None)
        gc.collect()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            s = parse(r.read().decode())
        assert (
            value(s, "vertumnus_controller_decision_seconds_count", namespace="ns", pool="p") == 1
        )
        assert value(s, "vertumnus_process_gc_pause_seconds_count", generation="2") >= 1
    finally:
        metrics.close()


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:notaport", "127.0.0.1:99999", "no-such-host.invalid:0"]
)
def test_a_metrics_address_that_cannot_be_served_is_a_clear_error(listen):
    with pytest.raises(ValueError, match=f"cannot serve metrics on '{listen}'"):
        OperatorMetrics().serve(listen)
    with pytest.raises(SystemExit, match="vertumnus operator: error: cannot serve metrics"):
        _serve_metrics(listen)
