"""The Grafana dashboard reads only metrics the router or the operator exports (it cannot drift silently)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from vertumnus.operator.metrics import OperatorMetrics
from vertumnus.router.metrics import RouterMetrics, _Snapshot

DASHBOARD = (
    Path(__file__).resolve().parents[2]
    / "deploy"
    / "helm"
    / "vertumnus"
    / "dashboards"
    / "vertumnus-pool.json"
)
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
    used = {name for e in exprs for name in re.findall(r"vertumnus_[a-z_]+", e)}
    assert used, "the dashboard reads no metric"
    missing = used - exported()
    assert not missing, f"the dashboard reads metrics nothing exports: {sorted(missing)}"
    assert {p["id"] for p in doc["panels"]} == set(range(1, len(doc["panels"]) + 1))
