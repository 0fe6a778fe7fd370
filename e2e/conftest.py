"""pytest fixtures for the end-to-end tests: one real Kubernetes control plane per session.

Run with ``python -m pytest e2e`` (the project's pytest config only collects ``tests/``).

The ``k8s`` fixture is an ``e2e/k8s/cluster.py`` ``Cluster``, started in a temporary state
directory (kept by pytest for the last few sessions, with each component's log under
``logs/``) and stopped after the session. Its binaries come from ``e2e/k8s/build.sh``; when
some are missing the fixture runs the build first (~20 minutes cold). A missing Go toolchain
therefore fails the session; set ``VERTUMNUS_E2E_SKIP_K8S=1`` to skip these tests instead.

The helper module is importable from tests as ``e2e_k8s_cluster`` (loaded here by path:
``e2e`` is not a package and ``cluster`` is too generic a top-level name).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_HELPER = Path(__file__).resolve().parent / "k8s" / "cluster.py"
_MODULE_NAME = "e2e_k8s_cluster"


def _load_helper():
    if _MODULE_NAME in sys.modules:
        return sys.modules[_MODULE_NAME]
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, _HELPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module  # before exec: the module must find itself by name
    spec.loader.exec_module(module)
    return module


cluster_helper = _load_helper()


@pytest.fixture(scope="session")
def k8s(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator:
    """A running control plane (kube-apiserver, controller-manager, scheduler, etcd, kwok).

    Attributes and methods tests use:
      kubeconfig: Path                       admin kubeconfig (system:masters)
      server: str                            https://127.0.0.1:<port>
      bin_dir: Path                          kubectl, helm and the components
      env() -> dict                          KUBECONFIG and PATH for subprocesses (helm, kubectl)
      kubectl(*args, input=None, check=True, kubeconfig=None, timeout=120) -> CompletedProcess[str]
      api(method, path, body=None) -> (status, dict)     raw HTTPS as admin
      add_gpu_nodes(n, gpus=8, prefix="gpu-node", *, cpu, memory, pods, labels, wait, timeout)
          -> list[str]                       kwok nodes, Ready on return
      remove_node(name, *, delete_pods=False, wait=True)
      kubeconfig_for_service_account(namespace, name, duration="24h") -> Path
    """
    if os.environ.get("VERTUMNUS_E2E_SKIP_K8S") == "1":
        pytest.skip("VERTUMNUS_E2E_SKIP_K8S=1: not starting a Kubernetes control plane")

    if cluster_helper.missing_binaries():
        # Show build.sh's progress live: the cold build takes ~20 minutes.
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\ne2e: missing {cluster_helper.missing_binaries()}; running build.sh")
            try:
                cluster_helper.build()
            except cluster_helper.ClusterError as err:
                pytest.fail(str(err), pytrace=False)

    cluster = cluster_helper.Cluster(tmp_path_factory.mktemp("k8s"))
    began = time.monotonic()
    try:
        cluster.start()
    except cluster_helper.ClusterError as err:
        pytest.fail(f"the control plane did not start: {err}", pytrace=False)
    print(
        f"\ne2e: control plane up in {time.monotonic() - began:.1f} s at {cluster.server}; "
        f"state in {cluster.state_dir}"
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(k8s) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    k8s.kubectl("create", "namespace", name)
    # Pods are rejected until the controller-manager has made the namespace's default SA.
    deadline = time.monotonic() + 30
    while k8s.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode:
        if time.monotonic() > deadline:
            pytest.fail(f"namespace {name} got no default ServiceAccount in 30 s")
        time.sleep(0.1)
    yield name
    k8s.kubectl("delete", "namespace", name, "--wait=false", check=False)


# ---- the support modules: `import e2e_pool_support`, `import e2e_operator_support` ----------


def _load_support(name: str, file: str):  # type: ignore[no-untyped-def]
    """Load e2e/``file`` as module ``name`` (``e2e`` is not a package), once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_load_support("e2e_pool_support", "pool_support.py")
operator_support = _load_support("e2e_operator_support", "operator_support.py")

# ---- the operator (e2e/test_operator*.py) ---------------------------------------------------


@pytest.fixture(scope="session")
def chart(k8s, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Helm chart installed (CRDs, RBAC, ServiceAccount; operator replicas 0): the
    kubeconfig of the chart's ServiceAccount, which the operator processes run under."""
    return operator_support.install_chart(k8s, tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def session_operator(chart, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The session's operator process (tests use :func:`operator`)."""
    from vertumnus.ports import free_port_base

    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = operator_support.OperatorProcess(
        chart, log, priority=10, name="session-operator", metrics_port=free_port_base(1)
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def operator(session_operator) -> Iterator:
    """The session's operator: a real `python -m vertumnus.operator run` process, all
    namespaces, under the chart's ServiceAccount, peering priority 10 (tests that start
    their own operators give them higher priorities; this one pauses meanwhile), its
    ``/metrics`` on a loopback port (``operator.scrape()``).

    Each test gets it acting: a test that ran a higher-priority operator leaves it paused
    until that operator's peering entry is gone (at once after SIGTERM, after its lifetime
    when killed), and the next test must not begin while it is.
    """
    operator_support.wait_for(
        "the session operator to be active (not paused by another's peering entry)",
        30,
        session_operator.active,
    )
    yield session_operator


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator:
    """A failed test that used the session's operator shows the end of its log."""
    outcome = yield
    report = outcome.get_result()
    proc = getattr(item, "funcargs", {}).get("operator")
    if report.when == "call" and report.failed and proc is not None:
        tail = "\n".join(proc.log().splitlines()[-60:])
        report.sections.append(("the session operator's log, last 60 lines", tail))


@pytest.fixture
def fake_router() -> Iterator:
    """The stand-in router's Admin API on loopback (tests/operator/fake_router.py)."""
    with operator_support.load_fake_router().FakeRouter() as router:
        yield router
