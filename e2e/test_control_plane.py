"""Checks that the e2e control plane behaves as the operator will need it.

Fake GPU nodes become Ready and run pods; native gang scheduling (PodGroup, Kubernetes 1.37
beta) holds a gang until all of it fits; a CRD's CEL rule rejects an object with 422 naming
the field; a ServiceAccount kubeconfig carries exactly its RBAC; helm runs.

Tests isolate themselves from each other's nodes with a per-test label and nodeSelector:
the session shares one cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import e2e_k8s_cluster as kc
import pytest

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: there is no kubelet


def _pool_label() -> dict[str, str]:
    return {"vertumnus.e2e/pool": uuid.uuid4().hex[:8]}


def _pod(name: str, namespace: str, node_selector: dict[str, str], gpus: int, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    # Extended resources: the request defaults to the limit.
                    "resources": {"limits": {kc.GPU_RESOURCE: str(gpus)}},
                }
            ],
            "nodeSelector": node_selector,
            "tolerations": [kc.FAKE_NODE_TOLERATION],
            **spec,
        },
    }


def _apply(k8s, *objects: dict) -> None:
    k8s.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def _pods(k8s, namespace: str) -> list[dict]:
    return json.loads(k8s.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]


def _wait(what: str, timeout: float, probe):
    """Poll probe() every 0.1 s until truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_server_version(k8s):
    version = json.loads(k8s.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == kc.K8S_VERSION
    assert version["clientVersion"]["gitVersion"] == kc.K8S_VERSION


def test_fake_gpu_nodes_become_ready_and_run_pods(k8s, namespace):
    labels = _pool_label()
    names = k8s.add_gpu_nodes(2, gpus=8, prefix="ready", labels=labels)  # waits for Ready
    assert len(names) == 2
    for name in names:
        node = json.loads(k8s.kubectl("get", "node", name, "-o", "json").stdout)
        assert node["status"]["capacity"][kc.GPU_RESOURCE] == "8"
        assert node["status"]["allocatable"][kc.GPU_RESOURCE] == "8"
        assert {
            "key": kc.FAKE_NODE_ANNOTATION,
            "value": kc.FAKE_NODE_VALUE,
            "effect": "NoSchedule",
        } in node["spec"]["taints"]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"

    # kwok plays the pod's lifecycle: bound pods reach Running and Ready.
    _apply(k8s, _pod("one-gpu", namespace, labels, gpus=1))
    k8s.kubectl("wait", "-n", namespace, "pod/one-gpu", "--for=condition=Ready", "--timeout=20s")
    pod = json.loads(k8s.kubectl("get", "pod", "one-gpu", "-n", namespace, "-o", "json").stdout)
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] in names

    # One GPU too many stays Pending, for want of the extended resource.
    _apply(k8s, _pod("too-big", namespace, labels, gpus=9))

    def unschedulable():
        pod = json.loads(k8s.kubectl("get", "pod", "too-big", "-n", namespace, "-o", "json").stdout)
        for c in pod["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return c
        return None

    condition = _wait("too-big to be marked unschedulable", 20, unschedulable)
    assert condition["reason"] == "Unschedulable"
    assert f"Insufficient {kc.GPU_RESOURCE}" in condition["message"]

    # The nodes stay Ready past the node lifecycle controller's grace period (50 s): kwok
    # renews a Lease for each, as a kubelet does. Without it they were marked NotReady
    # 50 s after they were made, and their pods' Ready with them, for good.
    def lease(name):
        status, body = k8s.api(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        )
        return body["spec"] if status == 200 else None

    first = _wait("the node Leases", 20, lambda: all(lease(n) for n in names) and lease(names[0]))
    assert first["leaseDurationSeconds"] == 40
    _wait("a Lease renewed", 30, lambda: lease(names[0])["renewTime"] != first["renewTime"])

    for name in names:
        k8s.remove_node(name, delete_pods=True)
    assert not set(names) & {
        n.split("/", 1)[1] for n in k8s.kubectl("get", "nodes", "-o", "name").stdout.split()
    }


def test_gang_binds_only_when_the_whole_gang_fits(k8s, namespace):
    labels = _pool_label()
    k8s.add_gpu_nodes(3, gpus=8, prefix="gang", labels=labels)
    group = "pool-a"
    _apply(
        k8s,
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": group, "namespace": namespace},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}},
        },
        *[
            _pod(f"member-{i}", namespace, labels, gpus=8, schedulingGroup={"podGroupName": group})
            for i in range(4)
        ],
    )

    pods = _pods(k8s, namespace)
    assert len(pods) == 4
    # With the feature gate off the apiserver silently drops the field and pods schedule
    # one by one; make sure it was kept.
    assert all(p["spec"].get("schedulingGroup", {}).get("podGroupName") == group for p in pods)

    def gang_rejected():
        _, body = k8s.api(
            "GET", f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{group}"
        )
        for c in body.get("status", {}).get("conditions", []):
            if c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "False":
                return c
        return None

    # The scheduler has considered the gang and refused it ...
    began = time.monotonic()
    condition = _wait("the scheduler to mark the gang unschedulable", 30, gang_rejected)
    assert condition["reason"] == "Unschedulable", condition
    # ... and keeps refusing through several retries (backoff 1-2 s).
    time.sleep(max(0.0, 6.0 - (time.monotonic() - began)))
    pods = _pods(k8s, namespace)
    assert [p["status"]["phase"] for p in pods] == ["Pending"] * 4
    assert [p["spec"].get("nodeName") for p in pods] == [None] * 4

    # A fourth node: now the whole gang fits, and all of it binds at once.
    k8s.add_gpu_nodes(1, gpus=8, prefix="gang", labels=labels)
    added = time.monotonic()

    def all_bound():
        pods = _pods(k8s, namespace)
        return pods if all(p["spec"].get("nodeName") for p in pods) else None

    pods = _wait("all four gang members to bind", 15, all_bound)
    bound_after = time.monotonic() - added
    print(f"gang bound {bound_after:.1f} s after the fourth node was Ready")
    assert bound_after < 10
    # 8 GPUs each on 8-GPU nodes: one member per node.
    assert len({p["spec"]["nodeName"] for p in pods}) == 4


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gpupools.e2e.vertumnus.io"},
    "spec": {
        "group": "e2e.vertumnus.io",
        "names": {"plural": "gpupools", "singular": "gpupool", "kind": "GpuPool"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["gpus"],
                                "properties": {"gpus": {"type": "integer", "minimum": 1}},
                                # fieldPath makes the error name spec.gpus instead of just spec.
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.gpus % 8 == 0",
                                        "fieldPath": ".gpus",
                                        "reason": "FieldValueInvalid",
                                        "message": "gpus must be a multiple of 8",
                                    }
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_cel_rule_rejects_with_422_naming_the_field(k8s, namespace):
    _apply(k8s, CRD)
    try:
        k8s.kubectl(
            "wait", "--for=condition=Established", "crd/gpupools.e2e.vertumnus.io", "--timeout=30s"
        )

        def pool(name: str, gpus: int) -> dict:
            return {
                "apiVersion": "e2e.vertumnus.io/v1alpha1",
                "kind": "GpuPool",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"gpus": gpus},
            }

        result = k8s.kubectl("apply", "-f", "-", input=json.dumps(pool("bad", 12)), check=False)
        assert result.returncode != 0
        assert "spec.gpus: Invalid value" in result.stderr, result.stderr
        assert "gpus must be a multiple of 8" in result.stderr

        status, body = k8s.api(
            "POST",
            f"/apis/e2e.vertumnus.io/v1alpha1/namespaces/{namespace}/gpupools",
            pool("bad", 12),
        )
        assert status == 422, body
        assert body["details"]["causes"][0]["field"] == "spec.gpus"
        assert body["details"]["causes"][0]["reason"] == "FieldValueInvalid"

        _apply(k8s, pool("good", 16))
    finally:
        k8s.kubectl("delete", "crd", "gpupools.e2e.vertumnus.io", "--wait=false", check=False)


def test_service_account_kubeconfig_has_only_its_rbac(k8s, namespace):
    k8s.kubectl("create", "serviceaccount", "operator", "-n", namespace)
    config = k8s.kubeconfig_for_service_account(namespace, "operator")

    denied = k8s.kubectl("get", "pods", "-n", namespace, kubeconfig=config, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr
    assert f"system:serviceaccount:{namespace}:operator" in denied.stderr

    k8s.kubectl(
        "create", "role", "pod-reader", "-n", namespace, "--verb=get,list", "--resource=pods"
    )
    k8s.kubectl(
        "create",
        "rolebinding",
        "pod-reader",
        "-n",
        namespace,
        "--role=pod-reader",
        f"--serviceaccount={namespace}:operator",
    )
    # RBAC changes reach the authorizer's cache asynchronously.
    _wait(
        "the RoleBinding to take effect",
        10,
        lambda: (
            k8s.kubectl("get", "pods", "-n", namespace, kubeconfig=config, check=False).returncode
            == 0
        ),
    )
    still_denied = k8s.kubectl("get", "nodes", kubeconfig=config, check=False)
    assert still_denied.returncode != 0 and "forbidden" in still_denied.stderr


def test_helm_runs_from_the_cache(k8s, tmp_path):
    helm = k8s.bin_dir / "helm"
    # Keep helm's own cache/config out of $HOME.
    env = {
        **k8s.env(),
        "HOME": str(tmp_path),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }
    version = subprocess.run(
        [str(helm), "version", "--short"], env=env, capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("v3.22.0"), version.stdout
    listed = subprocess.run(
        [str(helm), "list", "--all-namespaces"], env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
