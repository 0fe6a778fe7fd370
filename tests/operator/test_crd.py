"""The CRD and the operator's spec parser: one source of truth, the same defaults, errors
that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vertumnus.core.planner import PlannerSettings
from vertumnus.core.types import Composition
from vertumnus.operator import crd

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "cppool.yaml"
MINIMAL = {"gpus": 16, "engine": {"image": "img"}}


def _schema() -> dict[str, Any]:
    doc = yaml.safe_load(CRD_FILE.read_text())
    (version,) = doc["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


@pytest.mark.parametrize("copy", ["deploy/helm/vertumnus/crds", "operator/vertumnus_operator/crds"])
def test_the_chart_and_the_package_ship_the_crds_byte_for_byte(copy):
    folder = ROOT / copy
    ours = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert (
        ours
        == sorted(p.name for p in folder.glob("*.yaml"))
        == ["cppool.yaml", "kopf-peering.yaml"]
    )
    for name in ours:
        assert (folder / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"{copy}/{name} drifted from crds/{name}: run python -m vertumnus.operator crds --write"
        )


def test_crds_prints_the_packaged_copy():
    """What `python -m vertumnus.operator crds` prints comes from the package (a wheel has
    no crds/ folder), and is crds/ itself."""
    from vertumnus.operator.crdcheck import packaged_crds

    shipped = packaged_crds()
    assert [name for name, _ in shipped] == ["cppool.yaml", "kopf-peering.yaml"]
    for name, text in shipped:
        assert text == (ROOT / "crds" / name).read_text(encoding="utf-8")


def _defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores for an object that gives nothing: nested defaults."""
    out: dict[str, Any] = {}
    for key, prop in (schema.get("properties") or {}).items():
        if "default" in prop:
            value = prop["default"]
            if prop.get("type") == "object":
                value = {**_defaults(prop), **value}
            out[key] = value
    return out


_CAMEL = {
    "gpusPerDomain": "gpus_per_domain",
    "adminTLS": "admin_tls",
    "healthPort": "health_port",
    "updateStrategy": "update_strategy",
    "blockSize": "block_size",
    "maxTokens": "max_tokens",
    "basePort": "base_port",
    "betaBusy": "beta_busy",
    "lambda": "lam",
    "windowSeconds": "window_seconds",
    "hopSeconds": "hop_seconds",
    "mergeAdmit": "merge_admit",
    "persistWindows": "persist_windows",
    "drainTimeoutSeconds": "drain_timeout_seconds",
    "learnCapacity": "learn_capacity",
    "whatif": "whatif",
    "checksPerWindow": "checks_per_window",
    "whatifThreads": "whatif_threads",
    "whatifRows": "whatif_rows",
    "shadowMaxGpus": "shadow_max_gpus",
    "shadowMemoryMiB": "shadow_memory_mib",
    "dampFlaps": "damp_flaps",
    "thetaInter": "theta_inter",
    "thetaIntra": "theta_intra",
    "thetaReclaim": "theta_reclaim",
    "scanIntervalSeconds": "scan_interval_seconds",
    "metricsPort": "metrics_port",
    "adminPort": "admin_port",
    "admissionLimit": "admission_limit",
    "cacheManager": "cache_manager",
}


def test_the_parser_defaults_are_the_crd_defaults():
    spec = crd.parse_spec(MINIMAL)
    defaults = _defaults(_schema())
    defaults["engine"] = _defaults(_schema()["properties"]["engine"])
    # engine.transfer is nested in the CRD, flat in the parser (transfer_backend).
    transfer = defaults["engine"].pop("transfer")
    assert transfer == {"backend": "mooncake"} and spec.engine.transfer_backend == "mooncake"
    assert spec.engine.rdma_resource == ""
    # updateStrategy.rollingUpdate is nested in the CRD, flat in the parser.
    defaults["updateStrategy"] = _defaults(_schema()["properties"]["updateStrategy"])
    rolling = defaults["updateStrategy"].pop("rollingUpdate")
    assert rolling == {"maxUnavailable": 1, "partition": 0}
    assert spec.update_strategy.max_unavailable == 1 and spec.update_strategy.partition == 0
    checked = 0
    for key, value in defaults.items():
        attr = getattr(spec, _CAMEL.get(key, key))
        if isinstance(value, dict):
            for sub, v in value.items():
                got = getattr(attr, _CAMEL.get(sub, sub))
                assert got == v, f"spec.{key}.{sub}: CRD default {v!r}, parser {got!r}"
                checked += 1
        else:
            assert (list(attr) if isinstance(attr, tuple) else attr) == value, key
            checked += 1
    assert checked >= 30
    # Parsing the stored form (defaults applied) gives the same spec.
    assert (
        crd.parse_spec({**defaults, **MINIMAL, "engine": {**defaults["engine"], "image": "img"}})
        == spec
    )


def test_every_cel_rule_names_its_field():
    def rules(node: dict[str, Any]) -> list[dict[str, Any]]:
        out = list(node.get("x-kubernetes-validations") or [])
        for prop in (node.get("properties") or {}).values():
            out += rules(prop)
        return out

    found = rules(_schema())
    assert len(found) == 15
    assert all(r.get("fieldPath", "").startswith(".") and r.get("message") for r in found)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"gpus": 12}, "spec.gpus"),
        ({"gpusPerDomain": 6}, "spec.gpusPerDomain"),
        ({"degrees": [4, 16]}, "spec.degrees"),
        ({"degrees": [3]}, "spec.degrees[0]"),
        ({"degrees": [4, 4]}, "spec.degrees[1]"),
        ({"composition": [{"count": 2, "degree": 4}]}, "spec.composition"),
        (
            {"composition": [{"count": 4, "degree": 2}, {"count": 1, "degree": 8}]},
            "spec.composition[0].degree",
        ),
        ({"engine": {"image": ""}}, "spec.engine.image"),
        ({"engine": {"image": "x", "dtype": "fp8"}}, "spec.engine.dtype"),
        (
            {"engine": {"image": "x", "transfer": {"backend": "tcp"}}},
            "spec.engine.transfer.backend",
        ),
        (
            {"engine": {"image": "x", "transfer": {"rdma": {"resource": "rdma/hca"}}}},
            "spec.engine.transfer.rdma",
        ),
        ({"placement": {"beta": 0.5}}, "spec.placement.beta"),
        ({"placement": {"beta": 3.0, "betaBusy": 2.0}}, "spec.placement.betaBusy"),
        ({"controller": {"lower": 0.95}}, "spec.controller.lower"),
        ({"controller": {"mergeAdmit": 0.95}}, "spec.controller.mergeAdmit"),
        ({"controller": {"windowSeconds": 20, "hopSeconds": 7}}, "spec.controller.hopSeconds"),
        ({"controller": {"whatifThreads": 0}}, "spec.controller.whatifThreads"),
        ({"controller": {"whatifThreads": 17}}, "spec.controller.whatifThreads"),
        ({"controller": {"dampFlaps": -1}}, "spec.controller.dampFlaps"),
        ({"controller": {"whatifRows": 0}}, "spec.controller.whatifRows"),
        ({"cacheManager": {"thetaReclaim": 5.0}}, "spec.cacheManager.thetaReclaim"),
        ({"cacheManager": {"decay": 1.0}}, "spec.cacheManager.decay"),
        ({"redis": {"mode": "external"}}, "spec.redis.url"),
        ({"redis": {"mode": "cluster"}}, "spec.redis.mode"),
        ({"gang": {"backend": "kueue"}}, "spec.gang.backend"),
        ({"router": {"port": 9090}}, "spec.router.metricsPort"),
        ({"router": {"adminPort": 50050}}, "spec.router.adminPort"),
        ({"router": {"adminPort": 9090}}, "spec.router.adminPort"),
        ({"scheduling": {"nodeSelector": {"a": 1}}}, "spec.scheduling.nodeSelector.a"),
        ({"updateStrategy": {"type": "Recreate"}}, "spec.updateStrategy.type"),
        (
            {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}},
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        ),
        (
            {"updateStrategy": {"rollingUpdate": {"partition": -1}}},
            "spec.updateStrategy.rollingUpdate.partition",
        ),
    ],
)
def test_errors_name_the_field(change, field):
    with pytest.raises(crd.SpecError) as err:
        crd.parse_spec({**MINIMAL, **change})
    assert err.value.field == field, str(err.value)
    assert str(err.value).startswith(field + ": ")


def test_a_degree_outside_the_capacity_profile_is_refused():
    with pytest.raises(
        crd.SpecError, match=r"spec.degrees: degrees \[16\] are not in the capacity profile"
    ):
        crd.parse_spec({**MINIMAL, "gpusPerDomain": 16, "degrees": [8, 16]}, (1, 2, 4, 8))


def test_composition_initial_and_settings():
    spec = crd.parse_spec(
        {
            **MINIMAL,
            "gpus": 40,
            "composition": [{"count": 4, "degree": 4}, {"count": 3, "degree": 8}],
        }
    )
    assert spec.composition == Composition.parse("4xCP4+3xCP8") and spec.domains == 5
    assert spec.initial_composition() == Composition.parse("4xCP4+3xCP8")
    free = crd.parse_spec({**MINIMAL, "gpus": 40})
    assert str(free.initial_composition()) == "5xCP8"  # most large-degree workers
    ps = crd.parse_spec(
        {**MINIMAL, "controller": {"windowSeconds": 30, "hopSeconds": 10}}
    ).planner_settings()
    assert (ps.window_s, ps.hop, ps.hops_per_window, ps.degrees, ps.domain_size) == (
        30.0,
        10.0,
        3,
        (4, 8),
        8,
    )
    threads = crd.parse_spec({**MINIMAL, "controller": {"whatifThreads": 2}}).planner_settings()
    assert threads.whatif_threads == 2
    assert crd.parse_spec(MINIMAL).planner_settings().whatif_threads == 1
    # The bound on a look's replays: the core's default unless given.
    assert crd.parse_spec(MINIMAL).planner_settings().whatif_rows == PlannerSettings().whatif_rows
    rows = crd.parse_spec({**MINIMAL, "controller": {"whatifRows": 1000}}).planner_settings()
    assert rows.whatif_rows == 1000
    # Flap damping: on by default (2 flaps), 0 turns it off.
    assert crd.parse_spec(MINIMAL).planner_settings().damp_flaps == 2
    off = crd.parse_spec({**MINIMAL, "controller": {"dampFlaps": 0}}).planner_settings()
    assert off.damp_flaps == 0
    params = crd.parse_spec(
        {**MINIMAL, "placement": {"beta": 2, "betaBusy": 4, "lambda": 0.5}}
    ).placement_params()
    assert (params.beta, params.beta_busy, params.lam) == (2.0, 4.0, 0.5)


def test_installation_defaults_fill_unset_images():
    spec = crd.parse_spec(MINIMAL, router_image="r:1", redis_image="d:2")
    assert (spec.router.image, spec.redis.image) == ("r:1", "d:2")
    spec = crd.parse_spec({**MINIMAL, "router": {"image": "mine"}}, router_image="r:1")
    assert spec.router.image == "mine"


def test_the_installed_crd_is_compared_with_the_shipped_one_naming_the_difference(caplog):
    """``crdcheck``: the first path that differs, and the operator's loop saying so once
    per change, its gauge following (the real API server: the e2e)."""
    import asyncio
    import copy
    import logging

    from vertumnus.operator import crdcheck, handlers
    from vertumnus.operator.metrics import OperatorMetrics

    shipped = crdcheck.shipped_cppool()
    assert crdcheck.difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) is None
    assert crdcheck.difference({"a": 1}, {"a": 1, "b": 2}) == "b: missing in the installed CRD"
    assert "in the installed CRD, not in this operator's" in crdcheck.difference({"c": 1}, {})
    assert crdcheck.difference({"a": [1, 2]}, {"a": [1, 3]}) == (
        "a[1]: 2 in the installed CRD, 3 in this operator's"
    )
    older = copy.deepcopy(shipped)
    router = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del router["properties"]["router"]["properties"]["tls"]

    class Kube:
        def __init__(self) -> None:
            self.items = [older]

        async def request(self, method, path, params=None):  # type: ignore[no-untyped-def]
            assert params == {"fieldSelector": "metadata.name=cppools.vertumnus.io"}
            return {"items": self.items}

    kube, metrics = Kube(), OperatorMetrics()

    async def rounds() -> None:
        task = asyncio.create_task(handlers._keep_checking_crd(kube, metrics, every_s=0.01))
        await asyncio.sleep(0.05)
        assert metrics.crd_current is False
        kube.items = [shipped]
        await asyncio.sleep(0.05)
        assert metrics.crd_current is True
        kube.items = []
        await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="vertumnus.operator.handlers"):
        asyncio.run(rounds())
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "router.properties.tls: missing" in m]) == 1, said  # once
    assert "the installed CPPool CRD is this operator's again" in said
    assert any("CRD is not installed" in m and "kubectl apply --server-side" in m for m in said)
