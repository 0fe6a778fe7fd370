"""The shipped dashboard and alerts read only metrics the router or the operator exports.

Both live in the Helm chart (``dashboards/``, ``alerts/``); a metric renamed or removed
fails here instead of leaving a panel empty or an alert that can never fire.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from vertumnus.operator.metrics import OperatorMetrics
from vertumnus.router.metrics import RouterMetrics, _Snapshot

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "vertumnus"
DASHBOARD = CHART / "dashboards" / "vertumnus-pool.json"
RULES = CHART / "alerts" / "vertumnus-rules.yaml"
METRIC = re.compile(r"vertumnus_[a-z_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> set[str]:
    m = RouterMetrics("test")
    m._state.values = _Snapshot((), 1, 0, 0, ())  # noqa: SLF001 - a snapshot with no workers
    out = set()
    operator = OperatorMetrics()
    for family in [*m.registry.collect(), *operator.registry.collect()]:
        for suffix in _SUFFIXES.get(family.type, ("",)):
            out.add(family.name + suffix)
    return out


def test_every_metric_of_the_dashboard_is_exported() -> None:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    used = {name for e in exprs for name in METRIC.findall(e)}
    assert used, "the dashboard reads no metric"
    missing = used - exported()
    assert not missing, f"the dashboard reads metrics nothing exports: {sorted(missing)}"
    assert {p["id"] for p in doc["panels"]} == set(range(1, len(doc["panels"]) + 1))


def test_every_alert_is_complete_and_reads_exported_metrics() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for group in doc["groups"] for r in group["rules"]]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 8, names
    known = exported()
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        used = set(METRIC.findall(r["expr"]))
        assert used and used <= known, (r["alert"], sorted(used - known))
        # Balanced brackets: a typo that would make the rule file fail to load.
        for a, b in ("()", "[]", "{}"):
            assert r["expr"].count(a) == r["expr"].count(b), (r["alert"], a + b)
