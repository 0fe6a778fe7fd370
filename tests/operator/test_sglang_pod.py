"""The domain pod the operator renders for ``engine.kind: sglang``."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from vertumnus.core.lattice import Slot
from vertumnus.operator import gang as gangs
from vertumnus.operator import resources as res
from vertumnus.operator import sglang_pod
from vertumnus.operator.__main__ import main as operator_main
from vertumnus.operator.crd import SpecError, parse_spec

OWNER = res.Owner("pool", "ns", "uid-1")
MODEL = {
    "name": "qwen3-30b-a3b",
    "path": "/models/qwen3-30b-a3b",
    "volume": {"hostPath": "/nvme/q"},
}


def _spec(**extra):
    raw = {"gpus": 16, "engine": {"image": "sglang-vt:0.5.23", "kind": "sglang"}, "model": MODEL}
    return parse_spec({**raw, **extra})


TWO_CP4 = (Slot(3, 4, 1, 0), Slot(4, 4, 1, 4))


def _pod(spec, slots=TWO_CP4, epoch=7):
    return res.domain_pod(spec, OWNER, 1, slots, epoch, gangs.NativeGang())


def test_the_pod_holds_the_domain_shared_memory_nccl_and_the_model():
    pod = _pod(_spec())
    body = pod["spec"]
    (c,) = body["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["VERTUMNUS_POOL"] == "pool" and env["VERTUMNUS_DOMAIN"] == "1"
    assert (env["NCCL_DEBUG"], env["NCCL_IB_DISABLE"], env["NCCL_P2P_LEVEL"]) == (
        "WARN",
        "1",
        "NVL",
    )
    volumes = {v["name"]: v for v in body["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["model"]["hostPath"] == {"path": "/nvme/q", "type": "Directory"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert mounts["model"] == {"name": "model", "mountPath": MODEL["path"], "readOnly": True}
    assert mounts["podinfo"]["readOnly"] is True
    # The gang, the DNS name and the grouping annotations are the torch pod's.
    assert body["schedulingGroup"] == {"podGroupName": "pool"}
    assert body["hostname"] == "pool-d1" and body["subdomain"] == "pool-engines"
    assert pod["metadata"]["annotations"][res.ANN_DEGREES] == "4,4"


def test_a_claim_is_mounted_read_only():
    spec = _spec(model={**MODEL, "volume": {"claimName": "weights"}})
    volumes = {v["name"]: v for v in _pod(spec)["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}


def test_ports_of_every_server_and_the_adapter():
    (c,) = _pod(_spec(engine={"image": "i", "kind": "sglang", "basePort": 50100}))["spec"][
        "containers"
    ]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert len(ports) == len(c["ports"]) == 24  # names are unique
    assert all(len(name) <= 15 for name in ports)  # the API server's limit
    assert [ports[f"rank-{r}"] for r in range(8)] == list(range(50100, 50108))
    assert [ports[f"http-{r}"] for r in range(8)] == list(range(30000, 30008))
    assert [ports[f"boot-{r}"] for r in range(8)] == list(range(8998, 9006))
    all_ports = list(ports.values())
    assert len(set(all_ports)) == len(all_ports)


def test_probes_ask_the_adapter_for_the_pod_and_liveness_its_port():
    from vertumnus.worker.service import POD_SERVICE

    (c,) = _pod(_spec())["spec"]["containers"]
    assert sglang_pod.POD_HEALTH_SERVICE == POD_SERVICE  # the operator does not import it
    for probe in ("startupProbe", "readinessProbe"):
        # The pod's health, not every server's: a regroup or a failed worker keeps it Ready.
        assert c[probe]["grpc"] == {"port": 50051, "service": "vertumnus.worker.v1.Pod"}
        assert "exec" not in c[probe]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 600
    assert c["readinessProbe"]["failureThreshold"] == 3
    assert c["livenessProbe"] == {
        "tcpSocket": {"port": 50051},
        "periodSeconds": 10,
        "failureThreshold": 6,
    }


def _with_transfer(transfer):
    return _spec(engine={"image": "sglang-vt:0.5.23", "kind": "sglang", "transfer": transfer})


def test_the_transfer_backend_and_rdma_devices_are_rendered_when_asked():
    (plain,) = _pod(_spec())["spec"]["containers"]
    assert "--transfer-backend mooncake" in plain["command"][2]
    assert set(plain["resources"]["limits"]) == {"nvidia.com/gpu"}
    assert "securityContext" not in plain  # nothing the cluster may not have
    transfer = {"backend": "nixl", "rdma": {"resource": "rdma/rdma_shared_device_a", "count": 2}}
    (c,) = _pod(_with_transfer(transfer))["spec"]["containers"]
    assert "--transfer-backend nixl" in c["command"][2]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "2"}
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


@pytest.mark.parametrize(
    "rdma, field, text",
    [
        ({"count": 1}, "spec.engine.transfer.rdma.resource", "Required value"),
        ({"resource": "hca"}, "spec.engine.transfer.rdma.resource", "DOMAIN/NAME"),
        ({"resource": "nvidia.com/gpu"}, "spec.engine.transfer.rdma.resource", "not nvidia.com"),
        ({"resource": "rdma/hca", "count": 0}, "spec.engine.transfer.rdma.count", ">= 1"),
    ],
)
def test_bad_rdma_devices_name_the_field(rdma, field, text):
    with pytest.raises(SpecError) as err:
        _with_transfer({"rdma": rdma})
    assert err.value.field == field and text in str(err.value), str(err.value)


def test_the_backends_are_sglangs():
    from vertumnus.operator.crd import TRANSFER_BACKENDS
    from vertumnus.worker.sglang.command import TRANSFER_BACKENDS as SGLANG

    assert TRANSFER_BACKENDS == SGLANG


def test_the_pod_spec_does_not_depend_on_the_grouping():
    spec = _spec()
    a = _pod(spec, (Slot(3, 4, 1, 0), Slot(4, 4, 1, 4)), 7)
    b = _pod(spec, (Slot(5, 8, 1, 0),), 9)
    assert a["spec"] == b["spec"]
    assert (
        a["metadata"]["annotations"][res.ANN_SPEC_HASH]
        == b["metadata"]["annotations"][res.ANN_SPEC_HASH]
    )


def test_the_adapter_command_is_one_the_worker_cli_accepts(capsys):
    """The operator does not import the worker (layer contract): what it renders is checked
    here against `vertumnus worker`, with the degrees file read as the shell would."""
    from vertumnus.cli import main
    from vertumnus.worker.sglang.command import PortPlan

    assert vars(PortPlan()) == sglang_pod.PORT_BASES
    (c,) = _pod(_spec())["spec"]["containers"]
    sh, dash_c, line = c["command"]
    assert (sh, dash_c) == ("sh", "-c") and line.startswith("exec vertumnus worker --engine sglang")
    line = line.replace('"$(cat /etc/vertumnus/pod/degrees)"', "4,2,2")
    line = line.replace('"$(cat /etc/vertumnus/pod/workers)"', "7,12,13")
    words = shlex.split(line)[2:]
    assert words[words.index("--worker-ids") + 1] == "7,12,13"
    assert main([*words, "--print-command", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["offset"] for s in doc["servers"]] == [0, 4, 6]
    first = doc["servers"][0]
    assert first["argv"][first["argv"].index("--model-path") + 1] == MODEL["path"]
    assert first["argv"][first["argv"].index("--host") + 1] == "0.0.0.0"
    assert first["argv"][first["argv"].index("--served-model-name") + 1] == MODEL["name"]


def test_a_torch_pod_mounts_the_model_volume_too():
    spec = parse_spec({"gpus": 8, "engine": {"image": "i"}, "model": MODEL})
    (c,) = _pod(spec, (Slot(0, 8, 1, 0),))["spec"]["containers"]
    assert {"name": "model", "mountPath": MODEL["path"], "readOnly": True} in c["volumeMounts"]
    assert "--model /models/qwen3-30b-a3b" in c["command"][2]
    assert "startupProbe" not in c and "dshm" not in json.dumps(c)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"engine": {"image": "i", "kind": "sglang", "dtype": "float64"}}, "spec.engine.dtype"),
        ({"model": {"name": "m"}}, "spec.model.path"),
        ({"model": {**MODEL, "volume": {"hostPath": "/a", "claimName": "b"}}}, "spec.model.volume"),
        ({"model": {**MODEL, "volume": {"nfs": "x"}}}, "spec.model.volume.nfs"),
        ({"model": {**MODEL, "volume": {"claimName": ""}}}, "spec.model.volume.claimName"),
        ({"model": {**MODEL, "path": "models/q"}}, "spec.model.path"),
    ],
)
def test_specs_an_sglang_pod_cannot_run_name_the_field(change, field):
    with pytest.raises(SpecError) as err:
        _spec(**change)
    assert err.value.field == field, str(err.value)


def test_render_shows_the_sglang_pod(tmp_path, capsys):
    doc = {
        "apiVersion": "vertumnus.io/v1alpha1",
        "kind": "CPPool",
        "metadata": {"name": "sg", "namespace": "ns"},
        "spec": {
            "gpus": 8,
            "degrees": [4, 8],
            "engine": {"image": "img", "kind": "sglang"},
            "model": MODEL,
        },
    }
    path = tmp_path / "cppool.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert operator_main(["render", "-f", str(path)]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    (pod,) = [i for i in items if i["kind"] == "Pod"]
    assert "--engine sglang" in pod["spec"]["containers"][0]["command"][2]
    assert pod["metadata"]["annotations"][res.ANN_DEGREES] == "8"
