"""Helpers for the operator's e2e tests (and ``bench/operator_e2e.py``): the chart, the
operator as a real process, the stand-in router, CPPool manifests, waiting.

Loaded by path (``e2e`` is not a package): ``e2e/conftest.py`` imports it as
``e2e_operator_support``; the bench does the same.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "vertumnus"
EXAMPLE = CHART / "examples" / "cppool.yaml"
FAKE_ROUTER = ROOT / "tests" / "operator" / "fake_router.py"
PROMTEXT = ROOT / "tests" / "operator" / "promtext.py"
RELEASE = "vt"
SYSTEM_NAMESPACE = "vertumnus-system"
SERVICE_ACCOUNT = f"{RELEASE}-vertumnus-operator"
OPERATOR_POD_LABELS = (
    f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={RELEASE},"
    "app.kubernetes.io/name=vertumnus"
)
"""The chart's operator pods' labels (its ``vertumnus.selector``)."""
CPPOOLS = "/apis/vertumnus.io/v1alpha1"
FAKE_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def _test_module(name: str, path: Path) -> Any:
    """A helper module of the unit tests, loaded by path once (``tests`` may not be on
    ``sys.path`` when a bench loads this file)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_fake_router() -> Any:
    """The stand-in Admin server module (tests/operator/fake_router.py)."""
    return _test_module("vertumnus_e2e_fake_router", FAKE_ROUTER)


def load_promtext() -> Any:
    """The Prometheus text helpers of the unit tests (tests/operator/promtext.py)."""
    return _test_module("vertumnus_e2e_promtext", PROMTEXT)


def wait_for(what: str, timeout: float, probe: Callable[[], Any], interval: float = 0.1) -> Any:
    """Poll ``probe`` until it returns something truthy; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def helm(k8s: Any, *args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **k8s.env(),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    result = subprocess.run(
        [str(k8s.bin_dir / "helm"), *args], env=env, capture_output=True, text=True, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def install_chart(k8s: Any, home: Path) -> Path:
    """``helm install`` the chart (operator replicas 0: the tests run the operator as a local
    process under the chart's ServiceAccount); the SA's kubeconfig."""
    k8s.kubectl("create", "namespace", SYSTEM_NAMESPACE, check=False)
    helm(
        k8s,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NAMESPACE,
        "--set",
        "operator.replicas=0",
        home=home,
    )
    k8s.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/cppools.vertumnus.io",
        "crd/clusterkopfpeerings.kopf.dev",
        "--timeout=30s",
    )
    kubeconfig = Path(k8s.kubeconfig_for_service_account(SYSTEM_NAMESPACE, SERVICE_ACCOUNT))
    # The chart's key and CA, where the operator pod would mount them (the ServiceAccount
    # may not read Secrets: the test's own identity reads them).
    for field, path in admin_files(kubeconfig).items():
        path.write_bytes(chart_admin_key(k8s, field))
    return kubeconfig


def chart_admin_key(k8s: Any, field: str = "key") -> bytes:
    """A field of the chart's Secret of the operator's key (``key``, ``ca.crt``, ``ca.key``)."""
    name = f"{SERVICE_ACCOUNT}-admin-key"
    path = "{.data." + field.replace(".", "\\.") + "}"
    encoded = k8s.kubectl(
        "get", "secret", name, "-n", SYSTEM_NAMESPACE, "-o", f"jsonpath={path}"
    ).stdout
    return base64.b64decode(encoded)


def admin_files(kubeconfig: Path) -> dict[str, Path]:
    """Where the operator processes under ``kubeconfig`` read the chart's key and CA."""
    return {f: kubeconfig.with_name(f"admin-{f}") for f in ("key", "ca.crt", "ca.key")}


def pool_router_json(k8s: Any, ns: str, name: str, folder: Path) -> dict[str, Any]:
    """The router.json the operator rendered for pool ``name``, as a router pod sees it:
    written to ``folder/router.json`` with ``adminTokenFile`` (and, when the operator issued
    one, ``adminTlsCertFile`` and ``adminTlsKeyFile``) pointing at ``folder/admin-token``
    (``admin-tls.crt``, ``admin-tls.key``), the files of the pool's Secret (what the pod
    mounts)."""
    config = json.loads(
        k8s.kubectl("get", "configmap", f"{name}-router", "-n", ns, "-o", "json").stdout
    )["data"]["router.json"]
    doc = json.loads(config)
    secret = json.loads(
        k8s.kubectl("get", "secret", f"{name}-router-admin", "-n", ns, "-o", "json").stdout
    )["data"]
    for key, field in (
        ("token", "adminTokenFile"),
        ("tls.crt", "adminTlsCertFile"),
        ("tls.key", "adminTlsKeyFile"),
    ):
        if field in doc:
            (folder / f"admin-{key}").write_bytes(base64.b64decode(secret[key]))
            doc[field] = str(folder / f"admin-{key}")
    (folder / "router.json").write_text(json.dumps(doc))
    return doc


def pool_admin_tls(kubeconfig: Path, ns: str, name: str) -> Any:
    """How the operator under ``kubeconfig`` verifies pool ``name``'s routers' Admin port."""
    from vertumnus.admintls import AdminTLS, router_name

    return AdminTLS(admin_files(kubeconfig)["ca.crt"].read_bytes(), router_name(name, ns))


# `python -m vertumnus.operator ARGS`, dying with the test process (PR_SET_PDEATHSIG = 1).
_LAUNCH = (
    "import ctypes, runpy, signal, sys\n"
    "try:\n    ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    "sys.argv = ['vertumnus.operator', *sys.argv[1:]]\n"
    "runpy.run_module('vertumnus.operator', run_name='__main__', alter_sys=True)\n"
)


class OperatorProcess:
    """``python -m vertumnus.operator run`` as a subprocess, its log in ``log_path``."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        priority: int,
        name: str,
        peering_lifetime: int = 10,
        env: dict[str, str] | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.priority = priority
        self.name = name
        self.peering_lifetime = peering_lifetime
        self.extra_env = env or {}
        self.metrics_port = metrics_port
        """Where it serves ``/metrics`` on loopback (None: it serves none)."""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.lower().endswith("_proxy") and k != "KUBECONFIG"
        }
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            VERTUMNUS_ADMIN_KEY_FILE=str(admin_files(self.kubeconfig)["key"]),
            VERTUMNUS_ADMIN_CA_FILE=str(admin_files(self.kubeconfig)["ca.crt"]),
            VERTUMNUS_ADMIN_CA_KEY_FILE=str(admin_files(self.kubeconfig)["ca.key"]),
            POD_NAME=self.name,
            # Each pool's NetworkPolicies, as the chart's Deployment asks for them (its
            # operator pods' namespace and labels: the routers' Admin port takes only them).
            VERTUMNUS_POOL_NETWORK_POLICIES="true",
            POD_NAMESPACE=SYSTEM_NAMESPACE,
            VERTUMNUS_OPERATOR_POD_LABELS=OPERATOR_POD_LABELS,
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 -- the child keeps it
        # No preexec_fn: forking a process that serves gRPC (the stand-in router) runs gRPC's
        # fork handlers, which broke the child; the child sets its own parent-death signal.
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _LAUNCH,
                "run",
                f"--priority={self.priority}",
                f"--peering-lifetime={self.peering_lifetime}",
                *([f"--metrics-listen=127.0.0.1:{self.metrics_port}"] if self.metrics_port else []),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
        )
        log.close()
        return self

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample its ``/metrics`` serves now: (name, labels) → value."""
        assert self.metrics_port, "this operator serves no metrics"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = load_promtext().parse(
                r.read().decode()
            )
        return samples

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def active(self) -> bool:
        """kopf last logged a resume (at its start too), not a pause for a higher peer."""
        log = self.log()
        resumed = log.rfind("Resuming operations")
        return resumed >= 0 and resumed > log.rfind("Pausing operations")

    def kill(self) -> None:
        """SIGKILL: an operator that dies mid-work, leaving its peering entry behind."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (kopf leaves its peering entry, so others resume at once)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cppool(
    name: str, namespace: str, gpus: int, node_label: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "gpus": gpus,
        "engine": {"image": "ghcr.io/vertumnus/vertumnus:0.1.0"},
        "redis": {"mode": "none"},
        # The stand-in router reports the same demand at every take: one take per window.
        "controller": {"windowSeconds": 1, "checksPerWindow": 1},
        "scheduling": {
            "tolerations": [FAKE_TOLERATION],
            **({"nodeSelector": node_label} if node_label else {}),
        },
        "router": {
            "tolerations": [FAKE_TOLERATION],
            **({"nodeSelector": node_label} if node_label else {}),
            # The stand-in router speaks plaintext; the tests with a real router turn TLS on.
            "adminTLS": False,
        },
    }
    for k, v in spec.items():
        if isinstance(v, dict) and isinstance(body.get(k), dict):
            body[k] = {**body[k], **v}
        else:
            body[k] = v
    return {
        "apiVersion": "vertumnus.io/v1alpha1",
        "kind": "CPPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def apply(k8s: Any, *objects: dict[str, Any]) -> None:
    k8s.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def get_pool(k8s: Any, namespace: str, name: str) -> dict[str, Any]:
    status, body = k8s.api("GET", f"{CPPOOLS}/namespaces/{namespace}/cppools/{name}")
    assert status == 200, body
    return body


def pool_status(k8s: Any, namespace: str, name: str) -> dict[str, Any]:
    return get_pool(k8s, namespace, name).get("status") or {}


def engine_pods(k8s: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    status, body = k8s.api(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods?labelSelector=vertumnus.io/pool%3D{name},"
        "app.kubernetes.io/component%3Dengine",
    )
    assert status == 200, body
    return sorted(body["items"], key=lambda p: p["metadata"]["name"])


def events(k8s: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    status, body = k8s.api(
        "GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}"
    )
    assert status == 200, body
    return sorted(body["items"], key=lambda e: e["metadata"]["name"])


NEW_IMAGE = "ghcr.io/vertumnus/vertumnus:0.1.1"
"""The engine image a test rolls a pool to (``cppool`` renders 0.1.0)."""


def set_engine_image(k8s: Any, namespace: str, name: str, image: str = NEW_IMAGE) -> str:
    """Patch the CPPool's engine image (what makes its domain pods outdated); the image."""
    patch = {"spec": {"engine": {"image": image}}}
    k8s.kubectl("patch", "cppool", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    return image


def rolled_to(k8s: Any, namespace: str, name: str, image: str = NEW_IMAGE) -> dict[str, Any] | None:
    """The pool's status once every engine pod runs ``image`` and the pool is Ready (None
    before): a probe for :func:`wait_for`."""
    pods = engine_pods(k8s, namespace, name)
    if not pods or {c["image"] for p in pods for c in p["spec"]["containers"]} != {image}:
        return None
    st = pool_status(k8s, namespace, name)
    return st if st.get("phase") == "Ready" else None


def hold_pod(k8s: Any, namespace: str, pod: str) -> None:
    """A finalizer on ``pod``: deleted or evicted, it stays Terminating until
    :func:`release_pod`, as a pod does while its kubelet stops its containers (kwok removes
    it at once, and the operator, watching its pods, makes it again within a step)."""
    hold = json.dumps({"metadata": {"finalizers": ["e2e.vertumnus.io/kubelet"]}})
    k8s.kubectl("patch", "pod", pod, "-n", namespace, "--type=merge", "-p", hold)


def release_pod(k8s: Any, namespace: str, pod: str) -> None:
    """Remove the finalizers :func:`hold_pod` put on ``pod`` (no pod: nothing)."""
    k8s.kubectl(
        "patch", "pod", pod, "-n", namespace, "--type=merge",
        "-p", '{"metadata":{"finalizers":null}}', check=False,
    )  # fmt: skip


def own_address() -> str:
    """This machine's IPv4 address on its default route, where a test's router listens
    when the operator must find it through a Service (the API server refuses a loopback
    address in an EndpointSlice). Connecting a UDP socket sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError as e:
            raise AssertionError(f"this machine has no default IPv4 route ({e})") from None
        return str(s.getsockname()[0])


def router_slices(k8s: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """The EndpointSlices of the pool's ``<name>-router`` Service."""
    return json.loads(
        k8s.kubectl(
            "get", "endpointslices", "-n", namespace,
            "-l", f"kubernetes.io/service-name={name}-router", "-o", "json",
        ).stdout
    )["items"]  # fmt: skip


def router_endpoints(k8s: Any, namespace: str, name: str) -> set[str]:
    """The addresses of the endpoints of the pool's ``<name>-router`` Service."""
    slices = router_slices(k8s, namespace, name)
    return {a for sl in slices for e in sl.get("endpoints") or [] for a in e["addresses"]}


def stop_router_pods(k8s: Any, namespace: str, name: str) -> None:
    """Scale the pool's router Deployment (kwok's fake pods, which nothing answers at) to
    0 and wait until its Service has no endpoint left."""
    k8s.kubectl("scale", "deployment", f"{name}-router", "-n", namespace, "--replicas=0")
    wait_for(
        f"no endpoint of Service {name}-router",
        30,
        lambda: not router_endpoints(k8s, namespace, name),
    )


def add_router_endpoint(k8s: Any, namespace: str, name: str, host: str, **ports: int) -> None:
    """Make ``host`` (an IPv4 address, not loopback) a ready endpoint of the pool's
    ``<name>-router`` Service with ``ports`` (by name: ``grpc``, ``admin``), as the
    EndpointSlice controller does for a router pod: an EndpointSlice of the Service's,
    managed by the test."""
    service = f"{name}-router"
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-e2e",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "e2e.vertumnus.io",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports.items()],
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
    }
    k8s.kubectl("apply", "-f", "-", input=json.dumps(endpoints))


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


@contextlib.contextmanager
def gpu_nodes(k8s: Any, n: int, gpus: int = 8) -> Iterator[dict[str, str]]:
    """``n`` fake GPU nodes with a label of their own (removed afterwards)."""
    label = {"vertumnus.e2e/pool": uuid.uuid4().hex[:8]}
    names = k8s.add_gpu_nodes(
        n, gpus=gpus, prefix=f"op-{label['vertumnus.e2e/pool']}", labels=label
    )
    try:
        yield label
    finally:
        for node in names:
            if k8s.api("GET", f"/api/v1/nodes/{node}")[0] == 200:  # a test may have removed it
                k8s.remove_node(node, delete_pods=True, wait=False)
