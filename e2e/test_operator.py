"""The operator against a real control plane: the chart installed with helm, the operator a
real process under the chart's ServiceAccount, the stand-in router on real gRPC.

Each test owns its namespace and (where pods must bind) fake GPU nodes with a label of
its own; the session's operator (peering priority 10) serves them all, and the tests that
kill or duplicate the operator start their own, with higher priorities.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time

import e2e_operator_support as ops
import pytest
import yaml
from e2e_operator_support import (
    condition,
    cppool,
    engine_pods,
    events,
    get_pool,
    gpu_nodes,
    pool_status,
    wait_for,
)

from vertumnus.operator.handlers import WAKE
from vertumnus.operator.pool import endpoint_addresses


def _uids(k8s, ns, name):
    return [p["metadata"]["uid"] for p in engine_pods(k8s, ns, name)]


def _ready(k8s, ns, name, composition=None):
    def probe():
        st = pool_status(k8s, ns, name)
        if st.get("phase") != "Ready":
            return None
        if composition is not None and st.get("composition") != composition:
            return None
        return st

    return probe


def _mixed_pool(k8s, ns, name, label):
    """A 16-GPU pool pinned to 2xCP4+1xCP8 (domain 0: two CP4 workers, domain 1: one
    CP8) on the nodes with ``label``, Ready: its status."""
    mixed = [{"count": 2, "degree": 4}, {"count": 1, "degree": 8}]
    ops.apply(k8s, cppool(name, ns, 16, label, composition=mixed))
    return wait_for("Ready", 30, _ready(k8s, ns, name))


_sample = ops.load_promtext().value
"""A sample of an operator's scrape (None: no such series)."""


def _annotate_router(k8s, ns, name, router):
    k8s.kubectl(
        "annotate",
        "cppool",
        name,
        "-n",
        ns,
        "--overwrite",
        f"vertumnus.io/router-addresses={router.address}",
    )


# ---- the chart ----------------------------------------------------------------------------


def _mounts_admin_key(dep, secret):  # type: ignore[no-untyped-def]
    """The operator's pod reads ``secret``'s key from the file $VERTUMNUS_ADMIN_KEY_FILE names."""
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (path,) = [e["value"] for e in container["env"] if e["name"] == "VERTUMNUS_ADMIN_KEY_FILE"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret
    (item,) = [i for i in volume["secret"]["items"] if i["key"] == "key"]
    assert f"{mount['mountPath']}/{item['path']}" == path
    # Readable by the operator's user, through its group (non-root, fsGroup).
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    assert volume["secret"]["defaultMode"] & 0o040


def test_an_upgrade_keeps_the_operator_key(k8s, chart, tmp_path):
    """Every pool's Admin token is derived from the chart's key, and the routers'
    certificates are issued by its CA: an upgrade must keep both (the chart reads them back
    from the cluster), or every router would refuse the operator until the kubelet had
    updated each pool's Secret."""
    fields = ("key", "ca.crt", "ca.key")
    before = {f: ops.chart_admin_key(k8s, f) for f in fields}
    ops.helm(
        k8s, "upgrade", ops.RELEASE, str(ops.CHART), "-n", ops.SYSTEM_NAMESPACE,
        "--reuse-values", home=tmp_path,
    )  # fmt: skip
    assert {f: ops.chart_admin_key(k8s, f) for f in fields} == before
    assert len(before["key"]) == 48 and before["ca.crt"].startswith(b"-----BEGIN CERTIFICATE")
    # Rotating them (docs/operator.md, "The Admin token"): delete the Secret, upgrade.
    secret = f"{ops.SERVICE_ACCOUNT}-admin-key"
    k8s.kubectl("delete", "secret", secret, "-n", ops.SYSTEM_NAMESPACE)
    ops.helm(
        k8s, "upgrade", ops.RELEASE, str(ops.CHART), "-n", ops.SYSTEM_NAMESPACE,
        "--reuse-values", home=tmp_path,
    )  # fmt: skip
    after = {f: ops.chart_admin_key(k8s, f) for f in fields}
    assert all(after[f] != before[f] for f in fields) and len(after["key"]) == 48


def test_helm_lint_and_template_are_clean(k8s, tmp_path):
    lint = ops.helm(k8s, "lint", str(ops.CHART), "--strict", home=tmp_path)
    assert "0 chart(s) failed" in lint.stdout
    for extra in (
        [],
        [
            "--set",
            "operator.watchNamespaces={a,b}",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
        ],
    ):
        out = ops.helm(
            k8s, "template", "t", str(ops.CHART), "-n", "x", *extra, home=tmp_path
        ).stdout
        assert "kind: Deployment" in out and "kind: NetworkPolicy" in out
        docs = [d for d in yaml.safe_load_all(out) if d]
        (dep,) = [d for d in docs if d["kind"] == "Deployment"]
        # Every pool gets NetworkPolicies of its own from the operator, in whatever
        # namespace: the chart asks for them with the operator pods' namespace and labels
        # (the routers' Admin port takes only those pods), and lets it make them.
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") or e.get("valueFrom") for e in container["env"]}
        assert env["VERTUMNUS_POOL_NETWORK_POLICIES"] == "true"
        assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        labels = dict(kv.split("=") for kv in env["VERTUMNUS_OPERATOR_POD_LABELS"].split(","))
        assert labels.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        assert labels == {
            "app.kubernetes.io/name": "vertumnus",
            "app.kubernetes.io/instance": "t",
            "app.kubernetes.io/component": "operator",
        }
        granted = [
            r
            for d in docs
            if d["kind"] in ("ClusterRole", "Role")
            for r in d["rules"]
            if "networkpolicies" in r["resources"]
        ]
        assert granted and all(
            r["verbs"] == ["list", "create", "patch", "delete"] for r in granted
        ), granted
        assert {d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"} == {
            "t-vertumnus-operator"
        }  # the pools' are the operator's to make
        if extra:
            # The operator's metrics: served, exposed by a Service, scraped, let through.
            (container,) = dep["spec"]["template"]["spec"]["containers"]
            assert "--metrics-listen=0.0.0.0:9464" in container["args"]
            monitors = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceMonitor"}
            assert monitors == {"t-vertumnus-operator", "t-vertumnus-operator-routers"}
            (svc,) = [d for d in docs if d["metadata"]["name"] == "t-vertumnus-operator-metrics"]
            assert svc["spec"]["ports"][0]["port"] == 9464
            (policy,) = [
                d
                for d in docs
                if d["metadata"]["name"] == "t-vertumnus-operator" and d["kind"] == "NetworkPolicy"
            ]
            assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9464}]}]
            # The alerting rules, as the chart's rule file holds them.
            (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
            rules = yaml.safe_load((ops.CHART / "alerts" / "vertumnus-rules.yaml").read_text())
            assert rule["spec"] == rules
        # The operator's key: a Secret of the chart's, mounted where the operator reads it.
        (key,) = [d for d in docs if d["kind"] == "Secret"]
        assert key["metadata"]["name"] == "t-vertumnus-operator-admin-key"
        assert len(base64.b64decode(key["data"]["key"])) == 48
        _mounts_admin_key(dep, "t-vertumnus-operator-admin-key")
        # The CA the routers' Admin certificates are issued from, which the operator loads.
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        (items,) = [
            v["secret"]["items"]
            for v in dep["spec"]["template"]["spec"]["volumes"]
            if "secret" in v
        ]
        for var, field in (
            ("VERTUMNUS_ADMIN_CA_FILE", "ca.crt"),
            ("VERTUMNUS_ADMIN_CA_KEY_FILE", "ca.key"),
        ):
            assert env[var].endswith("/" + field) and {"key": field, "path": field} in items
            assert base64.b64decode(key["data"][field]).startswith(b"-----BEGIN")
    # A key of the user's own: the chart makes none and mounts that one.
    own = ops.helm(
        k8s, "template", "t", str(ops.CHART),
        "--set", "operator.adminKey.existingSecret=mine", home=tmp_path,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(own) if d]
    assert not [d for d in docs if d["kind"] == "Secret"]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    _mounts_admin_key(dep, "mine")
    # A Secret of one's own without a CA: Admin in plaintext, nothing else mounted.
    plain = ops.helm(
        k8s, "template", "t", str(ops.CHART), "--set", "operator.adminKey.existingSecret=mine",
        "--set", "operator.adminKey.tls=false", home=tmp_path,
    ).stdout  # fmt: skip
    assert "ca.crt" not in plain and "VERTUMNUS_ADMIN_CA_FILE" not in plain
    bad = ops.helm(
        k8s,
        "template",
        "t",
        str(ops.CHART),
        "--set",
        "operator.replicas=-1",
        home=tmp_path,
        check=False,
    )
    assert bad.returncode != 0 and "/operator/replicas" in bad.stderr
    # The shipped dashboard, in a ConfigMap Grafana's sidecar picks up; every
    # dashboards/*.json of the chart goes into it.
    (dash,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ConfigMap"]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["vertumnus-pool.json"])["panels"]
    chart = tmp_path / "chart"
    shutil.copytree(ops.CHART, chart)
    (chart / "dashboards" / "router.json").write_text('{"title": "Vertumnus router"}')
    out = ops.helm(k8s, "template", "t", str(chart), home=tmp_path).stdout
    (dash,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ConfigMap"]
    assert json.loads(dash["data"]["router.json"]) == {"title": "Vertumnus router"}
    assert "vertumnus-pool.json" in dash["data"]
    off = ops.helm(
        k8s, "template", "t", str(ops.CHART), "--set", "grafana.dashboards=false", home=tmp_path
    ).stdout
    assert "grafana_dashboard" not in off
    # Without networkPolicy.pools: no pool policies asked for, none allowed.
    closed = ops.helm(
        k8s, "template", "t", str(ops.CHART), "--set", "networkPolicy.pools=false", home=tmp_path
    ).stdout  # fmt: skip
    assert "VERTUMNUS_POOL_NETWORK_POLICIES" not in closed and "networkpolicies" not in closed


@pytest.mark.parametrize("example", ["cppool.yaml", "cppool-sglang.yaml"])
def test_rendered_manifests_are_accepted_by_the_api_server(
    k8s, chart, namespace, tmp_path, example
):
    chart_out = ops.helm(
        k8s,
        "template",
        "t",
        str(ops.CHART),
        "-n",
        namespace,
        "--set",
        "serviceMonitor.enabled=false",
        home=tmp_path,
    ).stdout
    result = k8s.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=chart_out)
    assert "(server dry run)" in result.stdout
    source = ops.CHART / "examples" / example
    extra: list[str] = []
    if example == "cppool-sglang.yaml":
        # The SGLang pool with what a production one adds: Prefill over TLS (the routers
        # probed on their plaintext health port), and its own NetworkPolicies.
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for d in docs:
            if d.get("kind") == "CPPool":
                d["spec"].setdefault("router", {})["tls"] = {"secretName": "prefill-cert"}
        source = tmp_path / example
        source.write_text(yaml.safe_dump_all(docs))
        extra = ["--pool-network-policies", "--operator-namespace", ops.SYSTEM_NAMESPACE,
                 "--operator-pod-labels", ops.OPERATOR_POD_LABELS]  # fmt: skip
    rendered = subprocess.run(
        [sys.executable, "-m", "vertumnus.operator", "render", "-f", str(source),
         "--namespace", namespace, *extra],
        capture_output=True,
        text=True,
        check=True,
        cwd=ops.ROOT,
    ).stdout  # fmt: skip
    items = json.loads(rendered)["items"]
    kinds = sorted({o["kind"] for o in items})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        *(["NetworkPolicy"] if extra else []),
        "Pod",
        "PodDisruptionBudget",
        "PodGroup",
        "Secret",
        "Service",
    ]
    if extra:
        (router,) = [o for o in items if o["metadata"]["name"].endswith("-router")
                     and o["kind"] == "Deployment"]  # fmt: skip
        (container,) = router["spec"]["template"]["spec"]["containers"]
        assert container["readinessProbe"]["grpc"]["port"] == 50070
    result = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    assert result.stdout.count("(server dry run)") == len(json.loads(rendered)["items"])


def test_the_service_account_has_only_what_it_needs(k8s, chart):
    sa = f"system:serviceaccount:{ops.SYSTEM_NAMESPACE}:{ops.SERVICE_ACCOUNT}"
    for verb, resource, allowed in [
        ("patch", "cppools.vertumnus.io/status", True),
        ("create", "pods", True),
        ("patch", "podgroups.scheduling.k8s.io", True),
        ("patch", "poddisruptionbudgets.policy", True),
        ("update", "poddisruptionbudgets.policy", False),
        # It creates the Redis password and applies each pool's Admin token (derived from
        # its key), and never reads a Secret back.
        ("patch", "secrets", True),
        ("get", "secrets", False),
        ("list", "secrets", False),
        ("update", "pods", False),
        ("list", "nodes", False),
        ("create", "cppools.vertumnus.io", False),
        ("delete", "cppools.vertumnus.io", False),
    ]:
        out = k8s.kubectl(
            "auth", "can-i", verb, resource, "--as", sa, "-A", check=False
        ).stdout.strip()
        assert out == ("yes" if allowed else "no"), (verb, resource, out)


# ---- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, field, text",
    [
        ({"gpus": 12}, "spec.gpus", "multiple of gpusPerDomain"),
        ({"gpus": 16, "degrees": [4, 16]}, "spec.degrees", "divide gpusPerDomain"),
        (
            {"gpus": 16, "composition": [{"count": 2, "degree": 4}]},
            "spec.composition",
            "exactly the GPU budget",
        ),
        (
            {"gpus": 16, "cacheManager": {"thetaReclaim": 6.0}},
            "spec.cacheManager.thetaReclaim",
            "thetaIntra",
        ),
        (
            {"gpus": 16, "controller": {"lower": 0.95}},
            "spec.controller.lower",
            "lower must be < upper",
        ),
        (
            {"gpus": 16, "controller": {"whatifThreads": 32}},
            "spec.controller.whatifThreads",
            "less than or equal to 16",
        ),
        (
            {"gpus": 16, "controller": {"dampFlaps": -1}},
            "spec.controller.dampFlaps",
            "greater than or equal to 0",
        ),
        (
            {"gpus": 16, "controller": {"whatifRows": 0}},
            "spec.controller.whatifRows",
            "greater than or equal to 1",
        ),
        ({"gpus": 16, "redis": {"mode": "external"}}, "spec.redis.url", "needs url"),
        (
            {"gpus": 16, "router": {"adminPort": 50050}},
            "spec.router.adminPort",
            "must differ from port and metricsPort",
        ),
        (
            {"gpus": 16, "updateStrategy": {"type": "Recreate"}},
            "spec.updateStrategy.type",
            'supported values: "RollingUpdate", "OnDelete"',
        ),
        (
            {"gpus": 16, "placement": {"beta": 2.0, "betaBusy": 1.5}},
            "spec.placement.betaBusy",
            ">= beta",
        ),
        (
            {"gpus": 16, "engine": {"transfer": {"rdma": {"resource": "rdma/hca"}}}},
            "spec.engine.transfer.rdma",
            "engine.kind sglang",
        ),
        (
            {
                "gpus": 16,
                "engine": {"kind": "sglang", "transfer": {"rdma": {"resource": "nvidia.com/gpu"}}},
            },
            "spec.engine.transfer.rdma.resource",
            "requested already",
        ),
        (
            {"gpus": 16, "engine": {"transfer": {"from": [{"podSelector": {}}]}}},
            "spec.engine.transfer.from",
            "SGLang engines only",
        ),
        (
            {"gpus": 16, "engine": {"kind": "sglang", "transfer": {"from": [{}]}}},
            "spec.engine.transfer.from[0]",
            "should have at least 1 properties",
        ),
        (
            {"gpus": 16, "router": {"tls": {"secretName": "Bad_Name"}}},
            "spec.router.tls.secretName",
            "should match",
        ),
    ],
)
def test_invalid_specs_are_rejected_naming_the_field(k8s, chart, namespace, spec, field, text):
    body = cppool("bad", namespace, **spec)
    status, reply = k8s.api("POST", f"{ops.CPPOOLS}/namespaces/{namespace}/cppools", body)
    assert status == 422, reply
    causes = reply["details"]["causes"]
    assert causes[0]["field"] == field, causes
    assert text in causes[0]["message"], causes


# ---- pools --------------------------------------------------------------------------------


def test_the_example_applies_and_binds_as_one_gang(k8s, operator, namespace):
    with gpu_nodes(k8s, 2):
        began = time.monotonic()
        k8s.kubectl("apply", "-n", namespace, "-f", str(ops.EXAMPLE))
        st = wait_for("the example pool to be Ready", 30, _ready(k8s, namespace, "qwen3-prefill"))
        took = time.monotonic() - began
        assert st["composition"] == "2xCP8" and st["readyGPUs"] == 16 and st["epoch"] == 1
        assert condition(st, "GangScheduled")["status"] == "True", st
        pods = engine_pods(k8s, namespace, "qwen3-prefill")
        assert [p["spec"]["schedulingGroup"]["podGroupName"] for p in pods] == ["qwen3-prefill"] * 2
        assert [
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods
        ] == ["8", "8"]
        assert [p["metadata"]["annotations"]["vertumnus.io/grouping"] for p in pods] == [
            "0:CP8@0",
            "1:CP8@0",
        ]
        assert all(p["metadata"]["ownerReferences"][0]["kind"] == "CPPool" for p in pods)
        table = k8s.kubectl("get", "cpp", "-n", namespace).stdout
        assert table.split("\n")[0].split() == [
            "NAME",
            "COMPOSITION",
            "EPOCH",
            "PHASE",
            "READY",
            "GPUS",
            "CHECK",
            "AGE",
        ]
        # No router reported a window yet: the CHECK column (the last what-if verdict)
        # is empty, so the row has one field fewer than the header.
        assert table.split("\n")[1].split()[:5] == ["qwen3-prefill", "2xCP8", "1", "Ready", "16"]
        assert len(table.split("\n")[1].split()) == 6
        print(f"example pool Ready in {took:.1f} s")
        k8s.kubectl(
            "delete", "-n", namespace, "-f", str(ops.EXAMPLE), "--wait=true", "--timeout=30s"
        )


def test_one_node_too_few_binds_no_pod_and_says_why(k8s, operator, namespace):
    with gpu_nodes(k8s, 2) as label:
        ops.apply(k8s, cppool("short", namespace, 24, label))

        def unschedulable():
            st = pool_status(k8s, namespace, "short")
            gang = condition(st, "GangScheduled")
            return (
                st
                if st.get("phase") == "Unschedulable" and gang.get("reason") == "Unschedulable"
                else None
            )

        st = wait_for("the pool to report why it cannot be placed", 30, unschedulable)
        gang = condition(st, "GangScheduled")
        assert gang["status"] == "False" and "minCount (3)" in gang["message"], gang
        assert condition(st, "Ready")["status"] == "False"
        time.sleep(2)  # the scheduler retries meanwhile; still nothing may bind
        assert not [p for p in engine_pods(k8s, namespace, "short") if p["spec"].get("nodeName")]
        with gpu_nodes(
            k8s,
            1,
        ) as more:
            k8s.kubectl(
                "label",
                "node",
                "--overwrite",
                "-l",
                f"vertumnus.e2e/pool={more['vertumnus.e2e/pool']}",
                f"vertumnus.e2e/pool={label['vertumnus.e2e/pool']}",
            )
            wait_for(
                "all three to bind once a third node exists", 30, _ready(k8s, namespace, "short")
            )
            k8s.kubectl("delete", "cppool", "short", "-n", namespace, "--timeout=30s")


def test_a_gang_api_the_cluster_lacks_is_a_condition_not_pods(k8s, operator, namespace):
    ops.apply(k8s, cppool("volcano", namespace, 16, gang={"backend": "volcano"}))

    def reported():
        st = pool_status(k8s, namespace, "volcano")
        return st if condition(st, "GangScheduled").get("reason") == "GangAPIUnavailable" else None

    st = wait_for("GangAPIUnavailable", 20, reported)
    assert "scheduling.volcano.sh/v1beta1" in condition(st, "GangScheduled")["message"]
    assert engine_pods(k8s, namespace, "volcano") == []
    assert any(e["reason"] == "GangAPIUnavailable" for e in events(k8s, namespace, "volcano"))


def test_demand_splits_then_merges_with_the_same_pods(k8s, operator, namespace, fake_router):
    with gpu_nodes(k8s, 2) as label:
        ops.apply(k8s, cppool("elastic", namespace, 16, label))
        wait_for("Ready", 30, _ready(k8s, namespace, "elastic", "2xCP8"))
        uids = _uids(k8s, namespace, "elastic")
        fake_router.set_demand(3.0, 30)  # 3 s of work per 1 s window on 1.26 s/s of capacity
        _annotate_router(k8s, namespace, "elastic", fake_router)
        st = wait_for("the split", 30, _ready(k8s, namespace, "elastic", "4xCP4"))
        assert st["epoch"] == 3 and [w["degree"] for w in st["workers"]] == [4, 4, 4, 4]
        pods = engine_pods(k8s, namespace, "elastic")
        assert [p["metadata"]["annotations"]["vertumnus.io/epoch"] for p in pods] == ["2", "3"]
        assert [p["metadata"]["annotations"]["vertumnus.io/degrees"] for p in pods] == [
            "4,4",
            "4,4",
        ]
        fake_router.set_demand(0.1, 30, 30, 0.1)  # light and long: merge
        st = wait_for("the merge", 30, _ready(k8s, namespace, "elastic", "2xCP8"))
        assert st["epoch"] == 5
        assert _uids(k8s, namespace, "elastic") == uids  # the pods never changed
        assert [s.kind for s in fake_router.applied] == ["split", "split", "merge", "merge"]
        reasons = [e["reason"] for e in events(k8s, namespace, "elastic")]
        for r in ("Split", "Draining", "Switching", "Committed", "Merge"):
            assert r in reasons, reasons
        assert reasons.count("Committed") == 4
        described = k8s.kubectl("describe", "cppool", "elastic", "-n", namespace).stdout
        assert "split committed under epoch 2" in described
        # Every transition is over: the record keeps no trace of them (a merge patch keeps
        # the keys it does not name, so a record that grew per transition would reach
        # etcd's object size limit in a few weeks of splits and merges).
        state = get_pool(k8s, namespace, "elastic")["status"]["state"]
        assert not state.get("started") and not state.get("drainedAt"), state
        # The operator's /metrics: what the status says, and every look and commit counted.
        at = {"namespace": namespace, "pool": "elastic"}

        def ready_metrics():
            # The gauges follow every status render, so a transient state (a window read
            # that timed out: Degraded for a step) shows there as in the status: poll.
            m = operator.scrape()
            return m if _sample(m, "vertumnus_operator_pool_phase", **at, phase="Ready") else None

        m = wait_for("the metrics to show the pool Ready", 10, ready_metrics)
        assert _sample(m, "vertumnus_pool_epoch", **at) == 5
        assert _sample(m, "vertumnus_operator_pool_workers", **at, degree="8") == 2
        assert _sample(m, "vertumnus_operator_pool_workers", **at, degree="4") is None
        assert _sample(m, "vertumnus_operator_pool_ready_gpus", **at) == 16
        assert _sample(m, "vertumnus_reconfigurations_total", **at, kind="split") == 2
        assert _sample(m, "vertumnus_reconfigurations_total", **at, kind="merge") == 2
        assert _sample(m, "vertumnus_controller_decision_seconds_count", **at) >= 2
        logged = len(operator.log())
        k8s.kubectl("delete", "cppool", "elastic", "-n", namespace, "--timeout=30s")
        # A deleted pool's series go with it.
        wait_for(
            "the pool's series to go",
            10,
            lambda: _sample(operator.scrape(), "vertumnus_pool_epoch", **at) is None,
        )
        # Its loop ended by itself: kopf did not have to cancel it (and warn).
        assert "is cancelled" not in operator.log()[logged:], operator.log()[logged:]


def test_the_what_if_check_looks_between_windows(k8s, operator, namespace, fake_router):
    """checksPerWindow 4 on 2 s windows: the operator reads the routers every 0.5 s (the
    rules still read whole windows), where one take per window would give 3 in 6 s."""
    with gpu_nodes(k8s, 2) as label:
        ops.apply(
            k8s,
            cppool(
                "looks",
                namespace,
                16,
                label,
                controller={"windowSeconds": 2, "checksPerWindow": 4, "whatifThreads": 2},
            ),
        )
        wait_for("Ready", 30, _ready(k8s, namespace, "looks", "2xCP8"))
        _annotate_router(k8s, namespace, "looks", fake_router)
        wait_for("a first take", 20, lambda: fake_router.takes)

        def state():
            return (get_pool(k8s, namespace, "looks").get("status") or {}).get("state") or {}

        logged, seq = len(operator.log()), state()["seq"]
        time.sleep(6.0)
        hops = sorted({hop for hop, _ in fake_router.takes})
        writes = state()["seq"] - seq
        assert len(hops) >= 8, fake_router.takes
        assert hops == list(range(1, len(hops) + 1))  # consecutive, none skipped
        # A look that decides nothing is not written at once (--record-looks-every, 30 s
        # by default): a write per look would be about 12 here. A look that changes what
        # the controller decided (a 2 s window of the rules' streaks) is.
        assert writes < len(hops) / 2, (writes, hops)
        # kopf runs the wake handler at each write's echo; its "succeeded" line is
        # dropped. (Other tests' pools may still be logging their deletion.)
        quiet = operator.log()[logged:]
        assert f"Handler {WAKE!r}" not in quiet, quiet

        # The controller's own memory (evaluations, flaps, streaks) is recorded with the
        # planner's state, at most 30 s after a look, where a restarted operator reads it.
        def memory():
            m = state().get("memory")
            return m if m and m["evaluations"] >= 4 else None

        recorded = wait_for("the controller's memory in the status", 40, memory)
        # (A merge patch drops null fields: no goal, no last move.)
        assert recorded["flaps"] == [] and recorded.get("goal") is None
        # The CPPool's size as its last status write returned it (etcd's limit is 1.5 MB).
        size = _sample(
            operator.scrape(),
            "vertumnus_operator_pool_object_bytes",
            namespace=namespace,
            pool="looks",
        )
        compact = len(json.dumps(get_pool(k8s, namespace, "looks"), separators=(",", ":")))
        assert size is not None and 0.8 * compact < size <= 1.2 * compact, (size, compact)
        k8s.kubectl("delete", "cppool", "looks", "-n", namespace, "--timeout=30s")


def test_a_pinned_composition_and_spec_changes(k8s, operator, namespace, fake_router):
    with gpu_nodes(k8s, 2) as label:
        ops.apply(
            k8s, cppool("pinned", namespace, 16, label, composition=[{"count": 2, "degree": 8}])
        )
        wait_for("Ready", 30, _ready(k8s, namespace, "pinned", "2xCP8"))
        uids = _uids(k8s, namespace, "pinned")
        _annotate_router(k8s, namespace, "pinned", fake_router)

        def router_template_hash():
            dep = json.loads(
                k8s.kubectl(
                    "get", "deployment", "pinned-router", "-n", namespace, "-o", "json"
                ).stdout
            )
            return dep["spec"]["template"]["metadata"]["annotations"][
                "vertumnus.io/router-config-hash"
            ]

        before = router_template_hash()
        patch = {
            "spec": {
                "composition": [{"count": 2, "degree": 4}, {"count": 1, "degree": 8}],
                "placement": {"beta": 2.0},
            }
        }
        k8s.kubectl(
            "patch", "cppool", "pinned", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )
        wait_for("the pinned composition", 30, _ready(k8s, namespace, "pinned", "2xCP4+1xCP8"))
        assert _uids(k8s, namespace, "pinned") == uids

        def router_config():
            cm = json.loads(
                k8s.kubectl(
                    "get", "configmap", "pinned-router", "-n", namespace, "-o", "json"
                ).stdout
            )
            return {k: json.loads(v) for k, v in cm["data"].items()}

        # layout.json (what a restarting router reads) follows the commit within a step.
        cfg = wait_for(
            "layout.json at epoch 2",
            10,
            lambda: (c := router_config())["layout.json"]["epoch"] == 2 and c,
        )
        assert cfg["router.json"]["placement"]["beta"] == 2.0
        # The router Deployment rolls to read it (the RouterConfigUpdated Event says so).
        wait_for("the router Deployment to roll", 10, lambda: router_template_hash() != before)
        (said,) = [
            e["message"]
            for e in events(k8s, namespace, "pinned")
            if e["reason"] == "RouterConfigUpdated"
        ]
        assert "Deployment pinned-router rolls to apply it" in said, said
        assert [w["degree"] for w in cfg["layout.json"]["workers"]] == [8, 4, 4]
        k8s.kubectl(
            "patch",
            "cppool",
            "pinned",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"gpus": 24, "composition": None}}),
        )

        def needs_new_pods():
            st = pool_status(k8s, namespace, "pinned")
            return st if condition(st, "Degraded").get("reason") == "NeedsNewPods" else None

        st = wait_for("NeedsNewPods", 20, needs_new_pods)
        assert st["readyGPUs"] == 16 and _uids(k8s, namespace, "pinned") == uids
        reasons = [e["reason"] for e in events(k8s, namespace, "pinned")]
        for r in ("CompositionPinned", "RouterConfigUpdated", "CompositionReached", "NeedsNewPods"):
            assert r in reasons, reasons
        k8s.kubectl("delete", "cppool", "pinned", "-n", namespace, "--timeout=30s")


def test_a_split_and_a_merge_asked_for_by_annotation(k8s, operator, namespace):
    # The operator finds the router as in a deployment: the ready endpoints of the pool's
    # router Service (the stand-in router on this machine's address, not loopback). A
    # split asked for while there is none waits, and says why at once (the window read
    # that would say so is an hour away here).
    fake = ops.load_fake_router().FakeRouter(host=ops.own_address())
    with gpu_nodes(k8s, 1) as label, fake as fake_router:
        ops.apply(k8s, cppool("byhand", namespace, 8, label, controller={"windowSeconds": 3600}))
        wait_for("Ready", 30, _ready(k8s, namespace, "byhand", "1xCP8"))
        # What the operator dials in a deployment: the router pod's Admin port, from the
        # slices the EndpointSlice controller made of the rendered Service and pod.
        dialled = wait_for(
            "the router pod's endpoint",
            30,
            lambda: endpoint_addresses(ops.router_slices(k8s, namespace, "byhand")),
        )
        (pod_ip,) = ops.router_endpoints(k8s, namespace, "byhand")
        assert dialled == [f"{pod_ip}:50060"]
        ops.stop_router_pods(k8s, namespace, "byhand")
        k8s.kubectl("annotate", "cppool", "byhand", "-n", namespace, "vertumnus.io/split=0")

        def no_router():
            st = pool_status(k8s, namespace, "byhand")
            why = condition(st, "Degraded")
            return st if why.get("reason") == "RouterUnavailable" else None

        st = wait_for("RouterUnavailable", 20, no_router)
        assert "no router address" in condition(st, "Degraded")["message"]
        assert st["composition"] == "1xCP8" and not fake_router.applied
        host, port = fake_router.address.rsplit(":", 1)
        ops.add_router_endpoint(k8s, namespace, "byhand", host, admin=int(port))
        st = wait_for("the split", 30, _ready(k8s, namespace, "byhand", "2xCP4"))
        assert condition(st, "Degraded")["status"] == "False"
        assert [w["id"] for w in st["workers"]] == [1, 2]
        annotations = get_pool(k8s, namespace, "byhand")["metadata"]["annotations"]
        assert "vertumnus.io/split" not in annotations
        k8s.kubectl("annotate", "cppool", "byhand", "-n", namespace, "vertumnus.io/merge=1,2")
        wait_for("the merge", 30, _ready(k8s, namespace, "byhand", "1xCP8"))
        k8s.kubectl("annotate", "cppool", "byhand", "-n", namespace, "vertumnus.io/split=9")
        wait_for(
            "the refusal",
            20,
            lambda: any(
                e["reason"] == "TransitionRefused" and "worker 9 is not in the pool" in e["message"]
                for e in events(k8s, namespace, "byhand")
            ),
        )
        assert [s.kind for s in fake_router.applied] == ["split", "merge"]
        k8s.kubectl("delete", "cppool", "byhand", "-n", namespace, "--timeout=30s")


def test_an_operator_killed_mid_transition_completes_it_once(
    k8s, chart, operator, namespace, fake_router, tmp_path
):
    with gpu_nodes(k8s, 1) as label:
        ops.apply(
            k8s, cppool("resume", namespace, 8, label, composition=[{"count": 1, "degree": 8}])
        )
        wait_for("Ready", 30, _ready(k8s, namespace, "resume", "1xCP8"))
        uids = _uids(k8s, namespace, "resume")
        _annotate_router(k8s, namespace, "resume", fake_router)
        fake_router.hold_drains()
        paused = operator.log().count("Pausing operations")
        first = ops.OperatorProcess(
            chart, tmp_path / "first.log", priority=50, name="first"
        ).start()
        try:
            # The session's operator steps back for the higher priority before anything starts.
            wait_for(
                "the session operator to pause",
                20,
                lambda: operator.log().count("Pausing operations") > paused,
            )
            k8s.kubectl(
                "patch",
                "cppool",
                "resume",
                "-n",
                namespace,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"composition": [{"count": 2, "degree": 4}]}}),
            )

            def draining():
                st = pool_status(k8s, namespace, "resume")
                return st if st.get("phase") == "Draining" and fake_router.drains else None

            st = wait_for("the drain to be held", 30, draining)
            assert st["transitions"][0]["kind"] == "split" and st["transitions"][0]["added"] == [
                1,
                2,
            ]
        finally:
            first.kill()
        fake_router.release_drains()
        second = ops.OperatorProcess(chart, tmp_path / "second.log", priority=60, name="second")
        with second:
            st = wait_for(
                "the transition to complete", 30, _ready(k8s, namespace, "resume", "2xCP4")
            )
            time.sleep(1.0)  # nothing more may happen
        st = pool_status(k8s, namespace, "resume")
        assert st["epoch"] == 2 and [w["id"] for w in st["workers"]] == [1, 2]
        assert st["lastTransition"]["id"] == 1 and st["transitions"] == []
        assert len(fake_router.applied) == 1 and fake_router.applied[0].epoch == 2
        assert _uids(k8s, namespace, "resume") == uids
        reasons = [e["reason"] for e in events(k8s, namespace, "resume")]
        assert reasons.count("Committed") == 1 and "Resumed" in reasons, reasons
        by = {e["reason"]: e.get("reportingInstance") for e in events(k8s, namespace, "resume")}
        assert (
            by["Draining"] == "first" and by["Resumed"] == "second" and by["Committed"] == "second"
        )
        k8s.kubectl("delete", "cppool", "resume", "-n", namespace, "--timeout=30s")


def test_two_operator_replicas_only_one_acts(
    k8s, chart, operator, namespace, fake_router, tmp_path
):
    a = ops.OperatorProcess(chart, tmp_path / "a.log", priority=70, name="replica-a")
    b = ops.OperatorProcess(chart, tmp_path / "b.log", priority=80, name="replica-b")
    paused = operator.log().count("Pausing operations")
    with gpu_nodes(k8s, 1) as label, a, b:
        # The session's operator must have stepped back before the pool exists.
        wait_for(
            "the session operator to pause",
            20,
            lambda: operator.log().count("Pausing operations") > paused,
        )

        def peers():
            status, body = k8s.api("GET", "/apis/kopf.dev/v1/clusterkopfpeerings/vertumnus")
            return (
                {v.get("priority") for v in (body.get("status") or {}).values()}
                if status == 200
                else set()
            )

        # Both replicas announce themselves in the peering object; kopf keeps the lower one
        # paused (from its start, or from when it sees the other).
        wait_for("both replicas in the peering object", 20, lambda: {70, 80} <= peers())

        # kopf starts paused and resumes only on a peering view without a higher peer;
        # b is in the object already, so a paused now stays paused.
        wait_for("replica-a to hold back", 20, lambda: not a.active())
        ops.apply(k8s, cppool("pair", namespace, 8, label, composition=[{"count": 1, "degree": 8}]))
        wait_for("Ready", 30, _ready(k8s, namespace, "pair", "1xCP8"))
        _annotate_router(k8s, namespace, "pair", fake_router)
        k8s.kubectl(
            "patch",
            "cppool",
            "pair",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"composition": [{"count": 2, "degree": 4}]}}),
        )
        wait_for("the split", 30, _ready(k8s, namespace, "pair", "2xCP4"))
        instances = {e.get("reportingInstance") for e in events(k8s, namespace, "pair")}
        assert instances == {"replica-b"}, instances
        assert len(fake_router.applied) == 1
        k8s.kubectl("delete", "cppool", "pair", "-n", namespace, "--timeout=30s")
    assert "vertumnus.operator.events" not in a.log()  # replica-a never acted
    for proc in (operator, a, b):
        assert "Forbidden" not in proc.log() and " 403 " not in proc.log(), proc.name


def test_a_lost_domain_pod_is_recreated_with_the_grouping_in_force(
    k8s, chart, operator, namespace, fake_router, tmp_path
):
    with gpu_nodes(k8s, 2) as label:
        st = _mixed_pool(k8s, namespace, "lossy", label)
        before = {p["metadata"]["name"]: p for p in engine_pods(k8s, namespace, "lossy")}
        victim = before["lossy-d1"]
        k8s.remove_node(victim["spec"]["nodeName"], delete_pods=True)

        def degraded():
            st = pool_status(k8s, namespace, "lossy")
            return st if condition(st, "Degraded").get("reason") == "DomainLost" else None

        st = wait_for("DomainLost", 20, degraded)
        assert st["phase"] == "Degraded" and st["readyGPUs"] == 8

        # An operator that takes over during the loss (the old one may have run on the lost
        # node) knows from the status that the pool ran: a loss, not a pool being placed.
        def lost_by(instance):
            return [
                e
                for e in events(k8s, namespace, "lossy")
                if e["reason"] == "DomainLost" and e.get("reportingInstance") == instance
            ]

        successor = ops.OperatorProcess(
            chart, tmp_path / "successor.log", priority=40, name="successor"
        )
        with successor, gpu_nodes(k8s, 1) as more:
            wait_for("the successor to report the loss", 20, lambda: lost_by("successor"))
            assert degraded()
            k8s.kubectl(
                "label",
                "node",
                "--overwrite",
                "-l",
                f"vertumnus.e2e/pool={more['vertumnus.e2e/pool']}",
                f"vertumnus.e2e/pool={label['vertumnus.e2e/pool']}",
            )
            wait_for("Ready again", 30, _ready(k8s, namespace, "lossy"))
            after = {p["metadata"]["name"]: p for p in engine_pods(k8s, namespace, "lossy")}
            assert after["lossy-d0"]["metadata"]["uid"] == before["lossy-d0"]["metadata"]["uid"]
            assert after["lossy-d1"]["metadata"]["uid"] != victim["metadata"]["uid"]
            ann = "vertumnus.io/grouping"
            assert (
                after["lossy-d1"]["metadata"]["annotations"][ann]
                == victim["metadata"]["annotations"][ann]
            )
            k8s.kubectl("delete", "cppool", "lossy", "-n", namespace, "--timeout=30s")


def test_a_ready_pool_watches_its_pods_and_router_instead_of_listing_them(k8s, operator, namespace):
    # Each pool keeps watched copies of its domain pods and of its router's EndpointSlices
    # (vertumnus.operator.informer): its steps, about one a second, list neither. Counted
    # by the operator itself (the API server's counts include kwok's and the controllers'
    # lists, which come and go with the nodes of other tests).
    def api(verb, resource):
        m = operator.scrape()
        return (
            _sample(m, "vertumnus_operator_api_requests_total", verb=verb, resource=resource) or 0
        )

    with gpu_nodes(k8s, 2) as label:
        watches = api("watch", "pods"), api("watch", "endpointslices")
        _mixed_pool(k8s, namespace, "watched", label)
        wait_for(
            "the pool's watches",
            10,
            lambda: (
                api("watch", "pods") > watches[0] and api("watch", "endpointslices") > watches[1]
            ),
        )
        time.sleep(1.0)  # past the pool's first steps
        before = api("list", "pods"), api("list", "endpointslices")
        time.sleep(8.0)
        lists = api("list", "pods") - before[0], api("list", "endpointslices") - before[1]
        assert lists == (0, 0), lists  # a list per step: about 8 of each
        # The copy follows the pods: one deleted by hand is made again.
        uid = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in engine_pods(k8s, namespace, "watched")
        }
        k8s.kubectl("delete", "pod", "watched-d0", "-n", namespace, "--wait=false")
        wait_for(
            "the deleted pod made again",
            20,
            lambda: any(
                p["metadata"]["name"] == "watched-d0" and p["metadata"]["uid"] != uid["watched-d0"]
                for p in engine_pods(k8s, namespace, "watched")
            ),
        )
        wait_for("Ready again", 30, _ready(k8s, namespace, "watched"))
        k8s.kubectl("delete", "cppool", "watched", "-n", namespace, "--timeout=30s")


def test_a_router_that_comes_back_clears_router_unavailable(k8s, operator, namespace):
    # A pinned pool whose router pods go says so (no address to reach it at), and stops
    # saying so once they are back (it used to stay Degraded for good).
    with gpu_nodes(k8s, 2) as label:
        _mixed_pool(k8s, namespace, "late", label)

        def scale(n):
            k8s.kubectl("scale", "deployment", "late-router", "-n", namespace, f"--replicas={n}")

        def router_unavailable():
            st = pool_status(k8s, namespace, "late")
            return condition(st, "Degraded").get("reason") == "RouterUnavailable"

        scale(0)
        wait_for("RouterUnavailable", 20, router_unavailable)
        scale(1)
        st = wait_for("Ready again", 20, _ready(k8s, namespace, "late"))
        assert condition(st, "Degraded")["status"] == "False"
        k8s.kubectl("delete", "cppool", "late", "-n", namespace, "--timeout=30s")


def test_a_new_engine_image_rolls_the_domain_pods_one_at_a_time(
    k8s, operator, namespace, fake_router
):
    with gpu_nodes(k8s, 2) as label:
        st = _mixed_pool(k8s, namespace, "rolling", label)
        workers = {d: sorted(w["id"] for w in st["workers"] if w["domain"] == d) for d in (0, 1)}
        before = {p["metadata"]["name"]: p for p in engine_pods(k8s, namespace, "rolling")}
        _annotate_router(k8s, namespace, "rolling", fake_router)
        fake_router.hold_drains()  # the first domain's drain cannot finish yet
        ops.set_engine_image(k8s, namespace, "rolling")

        def updating():
            st = pool_status(k8s, namespace, "rolling")
            return st if st.get("phase") == "Updating" and fake_router.drains else None

        st = wait_for("Updating, draining", 20, updating)
        assert condition(st, "Progressing")["reason"] == "RollingUpdate"
        assert condition(st, "Degraded")["status"] == "False"
        # Drained first: while the drain is held, the pod is not touched.
        time.sleep(1.0)
        assert _uids(k8s, namespace, "rolling") == [p["metadata"]["uid"] for p in before.values()]
        assert {w for w, _ in fake_router.drains} <= set(workers[0])
        fake_router.release_drains()

        st = wait_for("both pods rolled", 60, lambda: ops.rolled_to(k8s, namespace, "rolling"))
        after = {p["metadata"]["name"]: p for p in engine_pods(k8s, namespace, "rolling")}
        ann = "vertumnus.io/grouping"
        for name, pod in after.items():
            assert pod["metadata"]["uid"] != before[name]["metadata"]["uid"], name
            assert (
                pod["metadata"]["annotations"][ann] == before[name]["metadata"]["annotations"][ann]
            )
        # One domain at a time: the first domain's workers were drained, then resumed,
        # before any worker of the second was drained; every drained worker resumed.
        d0, d1 = set(workers[0]), set(workers[1])
        drained = {d: [t for w, t in fake_router.drains if w in ws] for d, ws in ((0, d0), (1, d1))}
        resumed = {
            d: [t for w, t in fake_router.resumes if w in ws] for d, ws in ((0, d0), (1, d1))
        }
        assert {w for w, _ in fake_router.resumes} == d0 | d1
        assert max(drained[0]) < min(resumed[0]) <= max(resumed[0]) < min(drained[1])
        assert max(drained[1]) < min(resumed[1])
        assert st["composition"] == "2xCP4+1xCP8" and st["epoch"] == 1
        assert condition(st, "Progressing")["status"] == "False"
        reasons = [e["reason"] for e in events(k8s, namespace, "rolling")]
        assert reasons.count("DomainPodReplaced") == 2, reasons
        assert "NeedsNewPods" not in reasons, reasons
        at = {"namespace": namespace, "pool": "rolling"}
        m = operator.scrape()
        assert _sample(m, "vertumnus_operator_domain_pods_replaced_total", **at) == 2
        assert _sample(m, "vertumnus_operator_domain_update_seconds_count", **at) == 2
        assert _sample(m, "vertumnus_operator_domain_update_seconds_sum", **at) >= 1.0
        assert _sample(m, "vertumnus_operator_pool_outdated_pods", **at) == 0
        k8s.kubectl("delete", "cppool", "rolling", "-n", namespace, "--timeout=30s")


def test_an_operator_restarted_mid_update_carries_on_from_the_record(
    k8s, chart, operator, namespace, fake_router, tmp_path
):
    """The first operator drains domain 0 and deletes its pod; the new pod cannot start
    (its node is cordoned) and the operator is killed. The next one reads the update from
    ``status.state.rolling``: domain 0's workers stay Updating and drained until the new
    pod is ready, then they are resumed and domain 1 rolls."""
    with gpu_nodes(k8s, 2) as label:
        st = _mixed_pool(k8s, namespace, "restarted", label)
        d0 = sorted(w["id"] for w in st["workers"] if w["domain"] == 0)
        (node,) = [
            p["spec"]["nodeName"]
            for p in engine_pods(k8s, namespace, "restarted")
            if p["metadata"]["name"] == "restarted-d0"
        ]
        _annotate_router(k8s, namespace, "restarted", fake_router)
        fake_router.hold_drains()
        paused = operator.log().count("Pausing operations")
        first = ops.OperatorProcess(chart, tmp_path / "first.log", priority=90, name="first")
        with first:
            wait_for(
                "the session operator to pause",
                20,
                lambda: operator.log().count("Pausing operations") > paused,
            )
            old = _uids(k8s, namespace, "restarted")[0]
            ops.set_engine_image(k8s, namespace, "restarted")
            wait_for("domain 0's drain", 20, lambda: fake_router.drains)
            k8s.kubectl("cordon", node)
            fake_router.release_drains()

            def replaced_and_pending():
                pods = {p["metadata"]["name"]: p for p in engine_pods(k8s, namespace, "restarted")}
                pod = pods.get("restarted-d0")
                return (
                    pod is not None
                    and pod["metadata"]["uid"] != old
                    and not pod["spec"].get("nodeName")
                )

            wait_for("domain 0's new pod, unscheduled", 20, replaced_and_pending)
            first.kill()
        second = ops.OperatorProcess(chart, tmp_path / "second.log", priority=95, name="second")
        with second:
            wait_for(
                "the second operator to take over",
                20,
                lambda: any(
                    e["reason"] == "Resumed" and e.get("reportingInstance") == "second"
                    for e in events(k8s, namespace, "restarted")
                ),
            )
            # While the new pod cannot start: Updating, domain 0's workers too, still drained.
            for _ in range(3):
                time.sleep(1.0)
                st = pool_status(k8s, namespace, "restarted")
                assert st["phase"] == "Updating", st
                assert condition(st, "Degraded")["status"] == "False", st
                states = {w["id"]: w["state"] for w in st["workers"]}
                assert {states[w] for w in d0} == {"Updating"}, states
            assert not {w for w, _ in fake_router.resumes} & set(d0), fake_router.resumes
            k8s.kubectl("uncordon", node)
            st = wait_for(
                "both pods rolled", 60, lambda: ops.rolled_to(k8s, namespace, "restarted")
            )
        assert {w for w, _ in fake_router.resumes} >= set(d0)
        assert get_pool(k8s, namespace, "restarted")["status"]["state"]["rolling"] == []
        by = [
            (e["reason"], e.get("reportingInstance")) for e in events(k8s, namespace, "restarted")
        ]
        assert ("DomainPodReplaced", "second") in by, by
        assert sum(1 for r, _ in by if r == "DomainPodReplaced") == 2, by
        assert not [r for r, _ in by if r in ("DomainLost", "WorkersResumed")], by
        k8s.kubectl("delete", "cppool", "restarted", "-n", namespace, "--timeout=30s")


def test_max_unavailable_domains_roll_together(k8s, operator, namespace, fake_router):
    with gpu_nodes(k8s, 2) as label:
        spec = {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 2}}}
        ops.apply(k8s, cppool("together", namespace, 16, label, **spec))
        _annotate_router(k8s, namespace, "together", fake_router)
        wait_for("Ready", 30, _ready(k8s, namespace, "together"))
        ops.set_engine_image(k8s, namespace, "together")
        st = wait_for("both pods rolled", 60, lambda: ops.rolled_to(k8s, namespace, "together"))
        # Both domains were drained before either resumed.
        assert len({w["domain"] for w in st["workers"]}) == 2
        assert max(t for _, t in fake_router.drains) < min(t for _, t in fake_router.resumes)
        assert {w for w, _ in fake_router.resumes} == {w["id"] for w in st["workers"]}
        k8s.kubectl("delete", "cppool", "together", "-n", namespace, "--timeout=30s")


def test_a_partition_rolls_a_canary_domain_first(k8s, operator, namespace, fake_router):
    """partition 1 of 2 domains: only domain 1 takes the new image (a canary); the pool is
    Ready with 1 of 2 domains updated; partition 0 rolls domain 0 too."""
    with gpu_nodes(k8s, 2) as label:
        spec = {"updateStrategy": {"rollingUpdate": {"partition": 1}}}
        ops.apply(k8s, cppool("canary", namespace, 16, label, **spec))
        wait_for("Ready", 30, _ready(k8s, namespace, "canary"))
        _annotate_router(k8s, namespace, "canary", fake_router)
        old = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in engine_pods(k8s, namespace, "canary")
        }
        image = ops.set_engine_image(k8s, namespace, "canary")

        def canary_done():
            st = pool_status(k8s, namespace, "canary")
            pods = {p["metadata"]["name"]: p for p in engine_pods(k8s, namespace, "canary")}
            d1 = pods.get("canary-d1")
            if (
                st.get("phase") != "Ready"
                or d1 is None
                or d1["metadata"]["uid"] == old["canary-d1"]
            ):
                return None
            return st, pods

        st, pods = wait_for("the canary domain rolled", 30, canary_done)
        time.sleep(1.5)  # nothing more may happen
        st = pool_status(k8s, namespace, "canary")
        assert st["phase"] == "Ready" and st["updatedDomains"] == 1 and st["domains"] == 2, st
        images = {
            p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
            for p in engine_pods(k8s, namespace, "canary")
        }
        assert images["canary-d1"] == image and images["canary-d0"] != image, images
        assert _uids(k8s, namespace, "canary")[0] == old["canary-d0"]
        wide = k8s.kubectl("get", "cppool", "canary", "-n", namespace, "-o", "wide").stdout
        assert "UPDATED" in wide.splitlines()[0], wide
        m = operator.scrape()
        at = {"namespace": namespace, "pool": "canary"}
        assert _sample(m, "vertumnus_operator_pool_outdated_pods", **at) == 1
        k8s.kubectl(
            "patch", "cppool", "canary", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}),
        )  # fmt: skip
        st = wait_for("the rest rolled", 30, lambda: ops.rolled_to(k8s, namespace, "canary", image))
        assert st["updatedDomains"] == 2
        k8s.kubectl("delete", "cppool", "canary", "-n", namespace, "--timeout=30s")


def test_on_delete_leaves_outdated_pods_until_deleted_by_hand(
    k8s, operator, namespace, fake_router
):
    with gpu_nodes(k8s, 1) as label:
        ops.apply(k8s, cppool("ondelete", namespace, 8, label, updateStrategy={"type": "OnDelete"}))
        _annotate_router(k8s, namespace, "ondelete", fake_router)
        wait_for("Ready", 30, _ready(k8s, namespace, "ondelete"))
        uids = _uids(k8s, namespace, "ondelete")
        ops.set_engine_image(k8s, namespace, "ondelete")

        def outdated():
            st = pool_status(k8s, namespace, "ondelete")
            return st if condition(st, "Degraded").get("reason") == "NeedsNewPods" else None

        st = wait_for("NeedsNewPods", 20, outdated)
        assert "OnDelete" in condition(st, "Degraded")["message"]
        time.sleep(1.0)
        assert _uids(k8s, namespace, "ondelete") == uids  # nothing replaced on its own
        k8s.kubectl("delete", "pod", "ondelete-d0", "-n", namespace, "--timeout=30s")

        wait_for(
            "the pod recreated with the new image",
            30,
            lambda: ops.rolled_to(k8s, namespace, "ondelete"),
        )
        k8s.kubectl("delete", "cppool", "ondelete", "-n", namespace, "--timeout=30s")


def test_evictions_take_one_domain_pod_at_a_time(k8s, operator, namespace, fake_router):
    # kubectl drain of GPU nodes evicts: the pool's PodDisruptionBudget lets one domain
    # pod go at a time (updateStrategy.rollingUpdate.maxUnavailable).
    with gpu_nodes(k8s, 2) as label:
        ops.apply(
            k8s, cppool("evict", namespace, 16, label, composition=[{"count": 2, "degree": 8}])
        )
        wait_for("Ready", 30, _ready(k8s, namespace, "evict"))

        pdb = _budget_counted(k8s, namespace, "evict-domains", 2)
        assert pdb["spec"]["minAvailable"] == 1 and pdb["status"]["disruptionsAllowed"] == 1

        # The evicted pod stays Terminating, as while its kubelet stops it: with kwok it
        # would be gone, made again and Ready before the second eviction is sent, which
        # the budget would then allow.
        ops.hold_pod(k8s, namespace, "evict-d0")
        try:
            status, reply = _evict(k8s, namespace, "evict-d0")
            assert status == 201, reply
            status, reply = _evict(k8s, namespace, "evict-d1")
            assert status == 429, reply
            assert "disruption budget" in reply.get("message", ""), reply
        finally:
            ops.release_pod(k8s, namespace, "evict-d0")
        # The evicted pod comes back (a lost domain), and the pool with it.
        wait_for("Ready again", 30, _ready(k8s, namespace, "evict"))
        k8s.kubectl("delete", "cppool", "evict", "-n", namespace, "--timeout=30s")


def _budget_counted(k8s, namespace, name, healthy):  # type: ignore[no-untyped-def]
    """The PodDisruptionBudget ``name`` once the disruption controller counts ``healthy``
    pods under it."""

    def counted():  # type: ignore[no-untyped-def]
        out = k8s.kubectl("get", "pdb", name, "-n", namespace, "-o", "json")
        pdb = json.loads(out.stdout)
        return pdb["status"].get("currentHealthy") == healthy and pdb

    return wait_for(f"budget {name} counting {healthy} healthy pods", 30, counted)


def _evict(k8s, namespace, pod):  # type: ignore[no-untyped-def]
    """POST an Eviction of ``pod`` (what ``kubectl drain`` sends): (HTTP status, reply)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}
    return k8s.api("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body)


def test_a_node_drain_evicts_one_router_at_a_time(k8s, operator, namespace, fake_router):
    # kubectl drain cordons its nodes, then evicts their pods. With two router replicas
    # the pool's router budget lets one go and refuses the other while the first one's
    # replacement cannot start (the nodes are cordoned): the pool keeps a router.
    with gpu_nodes(k8s, 2) as label:
        composition = [{"count": 2, "degree": 8}]
        ops.apply(
            k8s,
            cppool("rdrain", namespace, 16, label, composition=composition, router={"replicas": 2}),
        )
        wait_for("Ready", 30, _ready(k8s, namespace, "rdrain"))

        pdb = _budget_counted(k8s, namespace, "rdrain-router", 2)
        assert pdb["spec"]["maxUnavailable"] == 1 and pdb["status"]["disruptionsAllowed"] == 1
        routers = k8s.kubectl(
            "get", "pods", "-n", namespace, "-o", "name",
            "-l", "vertumnus.io/pool=rdrain,app.kubernetes.io/component=router",
        ).stdout.split()  # fmt: skip
        assert len(routers) == 2, routers
        ((key, value),) = label.items()
        k8s.kubectl("cordon", "-l", f"{key}={value}")
        try:
            status, reply = _evict(k8s, namespace, routers[0].removeprefix("pod/"))
            assert status == 201, reply
            status, reply = _evict(k8s, namespace, routers[1].removeprefix("pod/"))
            assert status == 429, reply
            assert "disruption budget" in reply.get("message", ""), reply
        finally:
            k8s.kubectl("uncordon", "-l", f"{key}={value}")
        _budget_counted(k8s, namespace, "rdrain-router", 2)  # two routers again
        k8s.kubectl("delete", "cppool", "rdrain", "-n", namespace, "--timeout=30s")


def test_every_pool_gets_network_policies_of_its_own(k8s, operator, namespace):
    """In a namespace the chart knows nothing of, the operator gives the pool its own
    policies: the routers' Admin port only from the operator's pods, the engines only from
    this pool's routers and engines. An SGLang pool's engines also take its decode servers
    (``spec.engine.transfer.from``), which the API server accepts as peers."""
    from vertumnus.operator import networkpolicy as netpol
    from vertumnus.operator import resources as res
    from vertumnus.operator.crd import parse_spec

    with gpu_nodes(k8s, 1) as label:
        ops.apply(k8s, cppool("guarded", namespace, 8, label))
        wait_for("Ready", 30, _ready(k8s, namespace, "guarded"))

        def policies():
            out = k8s.kubectl(
                "get", "networkpolicies", "-n", namespace, "-l", "vertumnus.io/pool=guarded",
                "-o", "json",
            ).stdout  # fmt: skip
            return {p["metadata"]["name"]: p for p in json.loads(out)["items"]} or None

        found = wait_for("the pool's policies", 10, policies)
        assert set(found) == {"guarded-routers", "guarded-engines"}  # no managed Redis
        pool_uid = get_pool(k8s, namespace, "guarded")["metadata"]["uid"]
        for p in found.values():
            assert p["metadata"]["ownerReferences"][0]["uid"] == pool_uid
        routers = found["guarded-routers"]["spec"]
        assert routers["podSelector"]["matchLabels"] == {
            "vertumnus.io/pool": "guarded",
            "app.kubernetes.io/component": "router",
        }
        by_port = {r["ports"][0]["port"]: r.get("from") for r in routers["ingress"]}
        assert by_port["grpc"] is None and by_port["metrics"] is None  # any client, scraper
        (admin,) = by_port["admin"]
        assert admin["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": ops.SYSTEM_NAMESPACE
        }
        labels = dict(kv.split("=") for kv in ops.OPERATOR_POD_LABELS.split(","))
        assert admin["podSelector"]["matchLabels"] == labels
        (engines_rule,) = found["guarded-engines"]["spec"]["ingress"]
        assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                for p in engines_rule["from"]] == ["router", "engine"]  # fmt: skip
        assert all(
            p["podSelector"]["matchLabels"]["vertumnus.io/pool"] == "guarded"
            for p in engines_rule["from"]
        )
        k8s.kubectl("delete", "cppool", "guarded", "-n", namespace, "--timeout=30s")

    decode = [{"namespaceSelector": {"matchLabels": {"team": "decode"}},
               "podSelector": {"matchLabels": {"role": "decode"}}}]  # fmt: skip
    spec = parse_spec(
        {
            "gpus": 8,
            "engine": {"image": "img", "kind": "sglang", "transfer": {"from": decode}},
            "model": {"path": "/models/m"},
        }
    )
    owner = res.Owner("sg", namespace, "00000000-0000-0000-0000-000000000001")
    peers = netpol.Peers(ops.SYSTEM_NAMESPACE, labels)
    rendered = netpol.pool_policies(spec, owner, peers)
    engines = [p for p in rendered if p["metadata"]["name"] == "sg-engines"][0]
    assert engines["spec"]["ingress"][1] == {"from": decode}
    for policy in rendered:
        policy["metadata"].pop("ownerReferences")  # no such CPPool: only the shape is checked
        k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(policy))


def test_the_operator_says_when_the_installed_crd_is_not_its_own(k8s, operator, chart, monkeypatch):
    """helm upgrade does not upgrade CRDs, and the API server drops what an older schema
    lacks: the operator compares the installed CPPool CRD with its own (at start and every
    5 minutes), under its ServiceAccount, and names the first difference."""
    import asyncio

    from vertumnus.operator import crdcheck
    from vertumnus.operator.kube import KubeClient, connection_info

    # The session operator compared them at start: the chart's CRD is the package's.
    assert _sample(operator.scrape(), "vertumnus_operator_crd_current") == 1
    monkeypatch.setenv("KUBECONFIG", str(chart))  # the operator's identity

    async def check():
        kube = KubeClient(connection_info())
        try:
            return await crdcheck.check(kube)
        finally:
            await kube.close()

    assert asyncio.run(check()) is None
    field = "/spec/properties/router/properties/healthPort/description"
    path = "/spec/versions/0/schema/openAPIV3Schema/properties" + field
    original = crdcheck.shipped_cppool()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    original = original["properties"]["spec"]["properties"]["router"]["properties"]["healthPort"]

    def describe(text):
        k8s.kubectl("patch", "crd", crdcheck.NAME, "--type=json",
                    "-p", json.dumps([{"op": "replace", "path": path, "value": text}]))  # fmt: skip

    describe("an older chart's words")
    try:
        problem = asyncio.run(check())
    finally:
        describe(original["description"])
    assert problem is not None
    assert "router.properties.healthPort.description" in problem, problem
    assert "kubectl apply --server-side" in problem, problem
    assert asyncio.run(check()) is None


def test_deleting_the_pool_removes_everything_it_made(k8s, operator, namespace):
    with gpu_nodes(k8s, 1) as label:
        ops.apply(k8s, cppool("doomed", namespace, 8, label, redis={"mode": "managed"}))
        wait_for("Ready", 30, _ready(k8s, namespace, "doomed"))
        selector = "vertumnus.io/pool=doomed"
        kinds = (
            "pods,deployments,services,configmaps,secrets,poddisruptionbudgets,"
            "podgroups.scheduling.k8s.io,networkpolicies"
        )
        made = k8s.kubectl(
            "get", kinds, "-n", namespace, "-l", selector, "-o", "name"
        ).stdout.split()
        assert any(m.startswith("secret/") for m in made) and any("podgroup" in m for m in made), (
            made
        )
        assert "poddisruptionbudget.policy/doomed-domains" in made, made
        assert "poddisruptionbudget.policy/doomed-router" in made, made
        for policy in ("doomed-routers", "doomed-redis", "doomed-engines"):
            assert f"networkpolicy.networking.k8s.io/{policy}" in made, made
        assert len(made) >= 13, made
        k8s.kubectl("delete", "cppool", "doomed", "-n", namespace, "--timeout=30s")
        left = k8s.kubectl(
            "get", "networkpolicies", "-n", namespace, "-l", selector, "-o", "name"
        ).stdout.split()
        assert left == [], left
        assert (
            k8s.kubectl(
                "get", "podgroups.scheduling.k8s.io", "doomed", "-n", namespace, check=False
            ).returncode
            != 0
        )

        def gone():
            left = k8s.kubectl(
                "get", kinds, "-n", namespace, "-l", selector, "-o", "name"
            ).stdout.split()
            # Deleted pods may linger as terminating until the GC finishes: none may be live.
            return not [x for x in left if not x.startswith("pod/")] and not [
                p
                for p in engine_pods(k8s, namespace, "doomed")
                if not p["metadata"].get("deletionTimestamp")
            ]

        wait_for("everything the pool made to be gone", 30, gone)
        assert get_pool is not None
