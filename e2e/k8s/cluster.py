"""Start and stop a real Kubernetes control plane on 127.0.0.1 for the end-to-end tests.

The cluster is etcd, kube-apiserver, kube-controller-manager and kube-scheduler built by
``e2e/k8s/build.sh`` (Kubernetes 1.37 with native gang scheduling switched on), plus kwok,
which fakes nodes (and the status of the pods bound to them): there is no kubelet, so pods
never run containers. Every process binds to 127.0.0.1 on ports picked at run time, logs to
``<state dir>/logs/<component>.log`` and runs in its own process group, so stopping kills
it with all its children.

Used two ways:

* from the e2e tests (``e2e/conftest.py``)::

      with Cluster(state_dir) as cluster:
          cluster.add_gpu_nodes(4)
          cluster.kubectl("get", "nodes")

* by hand::

      python e2e/k8s/cluster.py up [--nodes 4 --gpus 8]   # leaves it running in the background
      eval "$(python e2e/k8s/cluster.py env)"            # KUBECONFIG and PATH (kubectl, helm)
      python e2e/k8s/cluster.py down

Standard library only (plus ``openssl`` on PATH for the certificates).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

CACHE_DIR = Path(os.environ.get("VERTUMNUS_K8S_CACHE") or Path.home() / ".cache" / "vertumnus-k8s")
BIN_DIR = CACHE_DIR / "bin"
STAGES_DIR = CACHE_DIR / "kwok-stages"
DEFAULT_STATE_DIR = CACHE_DIR / "cluster"
BUILD_SCRIPT = Path(__file__).resolve().with_name("build.sh")
STATE_MARKER = ".vertumnus-e2e-cluster"

K8S_VERSION = "v1.37.2"
# Started in this order, stopped in the reverse one.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
REQUIRED_BINARIES = (*COMPONENTS, "kubectl", "helm")

# Native gang scheduling (PodGroup, spec.schedulingGroup) is beta and off by default in 1.37;
# it needs the gate on apiserver, scheduler and controller-manager *and* the API group served.
# With the gate off the apiserver silently drops spec.schedulingGroup.
FEATURE_GATES = "GenericWorkload=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's ClusterIP: must be in the serving cert

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"
# Pods need this toleration to land on a fake node; the taint keeps anything else off them.
FAKE_NODE_TOLERATION = {
    "key": FAKE_NODE_ANNOTATION,
    "operator": "Equal",
    "value": FAKE_NODE_VALUE,
    "effect": "NoSchedule",
}
GPU_RESOURCE = "nvidia.com/gpu"


class ClusterError(RuntimeError):
    """The control plane could not be built, started, reached or stopped."""


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call failed; unlike CalledProcessError its message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}"


def missing_binaries(bin_dir: Path = BIN_DIR) -> list[str]:
    """The binaries build.sh provides that are not (executable) in bin_dir."""
    return [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]


def build(cache_dir: Path = CACHE_DIR) -> None:
    """Run build.sh (builds only what is missing; ~20 min cold, seconds warm)."""
    env = {**os.environ, "VERTUMNUS_K8S_CACHE": str(cache_dir)}
    if subprocess.run(["bash", str(BUILD_SCRIPT)], env=env).returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed; its output above names the component and log")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join("    " + line for line in text[-lines:])


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the process that started it dies (Linux only).

    A pytest run that is itself killed cannot run its teardown; this keeps it from leaving
    a control plane behind.
    """
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Cluster:
    """One control plane whose files (PKI, etcd data, configs, logs) live in state_dir.

    Attributes set by start() (or by attach() for one already running):
      kubeconfig -- admin kubeconfig (group system:masters)
      server     -- https://127.0.0.1:<port>
      bin_dir    -- where kubectl, helm and the components live
    """

    def __init__(
        self,
        state_dir: Path | str = DEFAULT_STATE_DIR,
        *,
        bin_dir: Path | str = BIN_DIR,
        stages_dir: Path | str = STAGES_DIR,
        die_with_parent: bool = True,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.bin_dir = Path(bin_dir).resolve()
        self.stages_dir = Path(stages_dir).resolve()
        self.die_with_parent = die_with_parent
        self.pki = self.state_dir / "pki"
        self.logs = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.state_file = self.state_dir / "state.json"
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.server = ""
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ssl: ssl.SSLContext | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def attach(cls, state_dir: Path | str = DEFAULT_STATE_DIR) -> Cluster:
        """A handle on a cluster started earlier (by `cluster.py up`) from its state.json."""
        cluster = cls(state_dir)
        try:
            state = json.loads(cluster.state_file.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster state in {cluster.state_dir} (not started?)") from None
        cluster.bin_dir = Path(state["bin_dir"])
        cluster.ports = state["ports"]
        cluster.pids = state["pids"]
        cluster.server = state["server"]
        return cluster

    def running(self) -> list[str]:
        """Components whose recorded process is still alive."""
        return [name for name, pid in self.pids.items() if self._is_ours(name, pid)]

    def start(self, timeout: float = 60.0) -> None:
        """Start a fresh control plane (the state dir is wiped) and wait until it serves."""
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ClusterError(
                f"missing binaries in {self.bin_dir}: {', '.join(missing)}; run: bash {BUILD_SCRIPT}"
            )
        if not sorted(self.stages_dir.glob("*.yaml")):
            raise ClusterError(
                f"no kwok Stage YAMLs in {self.stages_dir}; run: bash {BUILD_SCRIPT}"
            )
        if shutil.which("openssl") is None:
            raise ClusterError("openssl is not on PATH; it makes the cluster's certificates")
        if self.state_file.exists():
            alive = Cluster.attach(self.state_dir).running()
            if alive:
                raise ClusterError(
                    f"a cluster is already running from {self.state_dir} "
                    f"({', '.join(alive)}); stop it first (cluster.py down)"
                )
        # Wiped for a fresh cluster, so only ever a directory this module made (or an empty one).
        marker = self.state_dir / STATE_MARKER
        if self.state_dir.exists() and any(self.state_dir.iterdir()) and not marker.exists():
            raise ClusterError(
                f"{self.state_dir} is not empty and not a cluster state dir (no {STATE_MARKER}); "
                "refusing to wipe it"
            )
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.logs.mkdir(parents=True)
        marker.write_text("state of an e2e/k8s/cluster.py control plane; wiped by each start\n")
        self.pki.mkdir()
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.ports = {
            name: free_port()
            for name in ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        }
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"
        self._make_pki()
        self._write_kubeconfig(
            self.kubeconfig,
            user={
                "client-certificate-data": _b64(self.pki / "admin.crt"),
                "client-key-data": _b64(self.pki / "admin.key"),
            },
        )

        self._spawn("etcd", self._etcd_args())
        self._wait_http(
            "etcd",
            f"http://127.0.0.1:{self.ports['etcd-client']}/health",
            deadline,
            lambda body: '"health":"true"' in body,
        )
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_http("kube-apiserver", f"{self.server}/readyz", deadline, lambda b: b == "ok")
        self._spawn("kube-controller-manager", self._controller_manager_args())
        self._spawn("kube-scheduler", self._scheduler_args())
        self._spawn("kwok", self._kwok_args())
        for name, port in (
            ("kube-controller-manager", self.ports["controller-manager"]),
            ("kube-scheduler", self.ports["scheduler"]),
        ):
            self._wait_http(
                name,
                f"https://127.0.0.1:{port}/healthz",
                deadline,
                lambda b: b == "ok",
                client_cert=False,
            )
        # Pods cannot be created before the controller-manager has made this ServiceAccount
        # (the ServiceAccount admission plugin rejects them).
        self._wait_for(
            "the default ServiceAccount",
            deadline,
            "kube-controller-manager",
            lambda: self._api_get("/api/v1/namespaces/default/serviceaccounts/default"),
        )
        # kwok serves no port: checking it is alive is all that can be done before a node
        # exists (add_gpu_nodes waits for kwok to make its nodes Ready).
        self._check_alive("kwok")
        self._save_state()

    def stop(self, grace: float = 10.0) -> None:
        """Stop every component (reverse start order): SIGTERM its group, SIGKILL after grace."""
        for name in reversed(COMPONENTS):
            pid = self.pids.get(name)
            if pid is None or not self._is_ours(name, pid):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            if not self._wait_exit(name, pid, grace):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._wait_exit(name, pid, 5.0)
            # Anything the component forked shares its group and would outlive it otherwise.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._procs.clear()
        self.pids.clear()
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    # ---- processes -------------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        # The child keeps its own copy of the log's descriptor.
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                # Its own process group: stop() signals the whole group.
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self._procs[name] = proc
        self.pids[name] = proc.pid
        self._save_state()

    def _is_ours(self, name: str, pid: int) -> bool:
        """pid is alive and still runs our binary (guards against a reused pid)."""
        proc = self._procs.get(name)
        if proc is not None:
            return proc.poll() is None
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        zombie = stat.rsplit(")", 1)[1].split()[0] == "Z"
        return not zombie and argv0 == str(self.bin_dir / name)

    def _wait_exit(self, name: str, pid: int, timeout: float) -> bool:
        proc = self._procs.get(name)
        if proc is not None:
            try:
                proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self._is_ours(name, pid):
                return True
            time.sleep(0.05)
        return False

    def _check_alive(self, name: str) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            raise ClusterError(
                f"{name} exited with status {proc.returncode}; last lines of "
                f"{self.logs / name}.log:\n{_tail(self.logs / f'{name}.log')}"
            )

    def _wait_for(self, what: str, deadline: float, component: str, probe) -> None:
        """Poll probe() until it returns truthy; fail with component's log tail."""
        last = ""
        while time.monotonic() < deadline:
            for name in self._procs:
                self._check_alive(name)
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError) as err:
                last = str(err)
            time.sleep(0.1)
        log = self.logs / f"{component}.log"
        raise ClusterError(
            f"timed out waiting for {what} (last error: {last or 'none'}); "
            f"last lines of {log}:\n{_tail(log)}"
        )

    def _wait_http(
        self, name: str, url: str, deadline: float, ok, client_cert: bool = True
    ) -> None:
        def probe() -> bool:
            ctx = self._ssl_context() if client_cert else _insecure_context()
            with _open(url, ctx, timeout=2) as resp:
                return bool(ok(resp.read().decode(errors="replace").strip()))

        self._wait_for(f"{name} at {url}", deadline, name, probe)

    def _save_state(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {
                    "server": self.server,
                    "kubeconfig": str(self.kubeconfig),
                    "bin_dir": str(self.bin_dir),
                    "ports": self.ports,
                    "pids": self.pids,
                },
                indent=2,
            )
        )

    # ---- component flags -------------------------------------------------------------------

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports['etcd-client']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        return [
            "--name=e2e",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}",
            # Tests do not need durability; fsync dominates etcd's latency on a busy disk.
            "--unsafe-no-fsync=true",
        ]

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd-client']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            "--advertise-address=127.0.0.1",
            # The endpoint reconciler refuses a loopback address for the `kubernetes` Service's
            # endpoints (and the apiserver exits); nothing could route to them here anyway.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # Front proxy (aggregation layer) identity, as a real cluster has it.
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            # APF queues and rejects bursts from one client; tests burst on purpose.
            "--enable-priority-and-fairness=false",
            f"--feature-gates={FEATURE_GATES}",
            f"--runtime-config={RUNTIME_CONFIG}",
            "--allow-privileged=true",
        ]

    def _component_common_args(self, port: int) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--feature-gates={FEATURE_GATES}",
        ]

    def _controller_manager_args(self) -> list[str]:
        p = self.pki
        return [
            f"--kubeconfig={self.kubeconfig}",
            *self._component_common_args(self.ports["controller-manager"]),
            "--leader-elect=false",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ]

    def _scheduler_args(self) -> list[str]:
        # With a config file the scheduler ignores its deprecated flags (--kubeconfig,
        # --leader-elect), so those live in the file too.
        config = self.state_dir / "kube-scheduler.yaml"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\n"
            "kind: KubeSchedulerConfiguration\n"
            "clientConnection:\n"
            f"  kubeconfig: {json.dumps(str(self.kubeconfig))}\n"
            "leaderElection:\n"
            "  leaderElect: false\n"
            # The default 10 s maximum backoff made a gang take 7.4 s instead of 1.5 s to
            # react to a freed node.
            "podInitialBackoffSeconds: 1\n"
            "podMaxBackoffSeconds: 2\n"
        )
        return [f"--config={config}", *self._component_common_args(self.ports["scheduler"])]

    def _kwok_args(self) -> list[str]:
        # Without the Stage definitions standalone kwok exits with "no stages found".
        stages = [f"--config={path}" for path in sorted(self.stages_dir.glob("*.yaml"))]
        return [
            f"--kubeconfig={self.kubeconfig}",
            # Only nodes made by add_gpu_nodes (annotated) are faked; kwok serves no port
            # unless --server-address or --node-port is given.
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={FAKE_NODE_VALUE}",
            # Pod IPs come from here; the default /24 runs out at a few hundred pods.
            "--cidr=10.0.0.0/16",
            # Standalone kwok keeps no node Leases unless told (its 40 s default is applied
            # only to a configuration file). Without them the node lifecycle controller
            # hears from a node only through its status, which the heartbeat stage renews
            # every 10-20 minutes: 50 s after a node is made it is marked NotReady, its
            # pods' Ready turns False, and no kwok stage ever turns it back.
            "--node-lease-duration-seconds=40",
            *stages,
        ]

    # ---- PKI and kubeconfigs ---------------------------------------------------------------

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(["openssl", *args], cwd=self.pki, capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"openssl {' '.join(args)} failed:\n{result.stderr}")

    def _make_pki(self) -> None:
        """CAs, serving/client certificates and the service-account key pair (EC P-256: fast)."""
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        for ca, cn in (
            ("ca", "vertumnus-e2e-ca"),
            ("front-proxy-ca", "vertumnus-e2e-front-proxy-ca"),
        ):
            self._openssl(
                "req",
                "-x509",
                *ec,
                "-keyout",
                f"{ca}.key",
                "-out",
                f"{ca}.crt",
                "-days",
                "3650",
                "-subj",
                f"/CN={cn}",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            )
        sans = ",".join(
            [
                "IP:127.0.0.1",
                f"IP:{SERVICE_IP}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        leaves = (
            # name, CA, subject, extended key usage, extra extension lines
            ("apiserver", "ca", "/CN=kube-apiserver", "serverAuth", f"subjectAltName={sans}\n"),
            ("admin", "ca", "/O=system:masters/CN=vertumnus-e2e-admin", "clientAuth", ""),
            ("front-proxy-client", "front-proxy-ca", "/CN=front-proxy-client", "clientAuth", ""),
        )
        for name, ca, subject, usage, extra in leaves:
            ext = self.pki / f"{name}.ext"
            ext.write_text(
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage={usage}\n{extra}"
            )
            self._openssl(
                "req",
                "-new",
                *ec,
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.csr",
                "-subj",
                subject,
            )
            self._openssl(
                "x509",
                "-req",
                "-in",
                f"{name}.csr",
                "-CA",
                f"{ca}.crt",
                "-CAkey",
                f"{ca}.key",
                "-CAcreateserial",
                "-days",
                "365",
                "-out",
                f"{name}.crt",
                "-extfile",
                ext.name,
            )
        self._openssl(
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            "sa.key",
        )
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _write_kubeconfig(self, path: Path, user: dict[str, str]) -> None:
        # JSON is YAML: no YAML library needed.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "user"}}],
            "current-context": "e2e",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount namespace/name (a bound token).

        The ServiceAccount must exist. Use it to run a client with exactly that account's
        RBAC permissions (e.g. the operator under its Helm chart's ServiceAccount).
        """
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        path = self.state_dir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, user={"token": token})
        return path

    # ---- talking to the API ----------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._ssl = ctx
        return self._ssl

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """One request to the apiserver as admin: (HTTP status, decoded JSON body).

        HTTP errors are returned, not raised, so a test can assert on e.g. a 422 and its
        details.causes.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with _open(request, self._ssl_context(), timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"raw": raw.decode(errors="replace")}

    def _api_get(self, path: str) -> dict | None:
        """GET path as admin; None on 404; ClusterError on any other failure."""
        status, body = self.api("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise ClusterError(f"GET {path}: HTTP {status}: {body}")
        return body

    def env(self) -> dict[str, str]:
        """Environment for a client of this cluster: KUBECONFIG and PATH with kubectl and helm."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # noqa: A002 -- mirrors subprocess.run
        check: bool = True,
        kubeconfig: Path | str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (admin unless kubeconfig is given); text output."""
        cmd = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            *args,
        ]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    # ---- fake nodes ------------------------------------------------------------------------

    def add_gpu_nodes(
        self,
        n: int,
        gpus: int = 8,
        prefix: str = "gpu-node",
        *,
        cpu: str = "96",
        memory: str = "1Ti",
        pods: str = "110",
        labels: dict[str, str] | None = None,
        wait: bool = True,
        timeout: float = 30.0,
    ) -> list[str]:
        """Create n kwok-managed nodes with `gpus` nvidia.com/gpu each; wait until Ready.

        Names are <prefix>-<i> with the lowest indices not taken. Pods need
        FAKE_NODE_TOLERATION to be scheduled on them.
        """
        existing = {item["metadata"]["name"] for item in self._api_get("/api/v1/nodes")["items"]}
        names: list[str] = []
        i = 0
        while len(names) < n:
            name = f"{prefix}-{i}"
            if name not in existing:
                names.append(name)
            i += 1
        resources = {"cpu": cpu, "memory": memory, "pods": pods, GPU_RESOURCE: str(gpus)}
        nodes = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {FAKE_NODE_ANNOTATION: FAKE_NODE_VALUE},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        **(labels or {}),
                    },
                },
                "spec": {
                    "taints": [
                        {
                            "key": FAKE_NODE_ANNOTATION,
                            "value": FAKE_NODE_VALUE,
                            "effect": "NoSchedule",
                        }
                    ]
                },
                # A Node's status is accepted on create: this is what the scheduler counts.
                "status": {"capacity": resources, "allocatable": resources},
            }
            for name in names
        ]
        self.kubectl(
            "create",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}),
        )
        if wait:
            self.wait_nodes_ready(names, timeout)
        return names

    def wait_nodes_ready(self, names: Iterable[str], timeout: float = 30.0) -> None:
        """Wait until every named node has condition Ready=True (kwok sets it)."""
        pending = set(names)
        deadline = time.monotonic() + timeout
        while pending:
            for item in self._api_get("/api/v1/nodes")["items"]:
                conditions = item.get("status", {}).get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    pending.discard(item["metadata"]["name"])
            if not pending:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"nodes not Ready after {timeout} s: {sorted(pending)}; last lines of "
                    f"{self.logs / 'kwok.log'}:\n{_tail(self.logs / 'kwok.log')}"
                )
            time.sleep(0.1)

    def remove_node(self, name: str, *, delete_pods: bool = False, wait: bool = True) -> None:
        """Delete a node, as if the machine was lost.

        With no kubelet nothing terminates the pods bound to it: the controller-manager's pod
        GC removes them about a minute later. delete_pods=True force-deletes them right away.
        """
        self.kubectl("delete", "node", name, f"--wait={str(wait).lower()}")
        if delete_pods:
            self.kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                f"--field-selector=spec.nodeName={name}",
                "--force",
                "--grace-period=0",
            )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _insecure_context() -> ssl.SSLContext:
    # The controller-manager and scheduler serve self-signed certificates made at start.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# No proxies: https_proxy from the environment must not capture requests to 127.0.0.1.
_NO_PROXY = urllib.request.ProxyHandler({})


def _open(url: str | urllib.request.Request, ctx: ssl.SSLContext, timeout: float):
    opener = urllib.request.build_opener(_NO_PROXY, urllib.request.HTTPSHandler(context=ctx))
    return opener.open(url, timeout=timeout)


# ---- command line --------------------------------------------------------------------------


def _print_env(cluster: Cluster) -> None:
    for key, value in cluster.env().items():
        print(f"export {key}={_sh_quote(value)}")


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"PKI, etcd data, logs (default {DEFAULT_STATE_DIR})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a fresh cluster in the background")
    up.add_argument("--nodes", type=int, default=0, help="fake GPU nodes to add (default 0)")
    up.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node (default 8)")
    up.add_argument(
        "--build", action="store_true", help="run build.sh first if binaries are missing"
    )
    sub.add_parser("down", help="stop the cluster started by `up`")
    sub.add_parser("env", help="print `export KUBECONFIG=... PATH=...` for eval")
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            if args.build and missing_binaries():
                build()
            began = time.monotonic()
            # Detached: the components outlive this command until `down`.
            cluster = Cluster(args.state_dir, die_with_parent=False)
            cluster.start()
            if args.nodes:
                cluster.add_gpu_nodes(args.nodes, gpus=args.gpus)
            print(
                f"cluster up in {time.monotonic() - began:.1f} s: {cluster.server}, "
                f"logs in {cluster.logs}",
                file=sys.stderr,
            )
            _print_env(cluster)
        elif args.command == "down":
            if not (args.state_dir / "state.json").exists():
                print(f"no cluster running from {args.state_dir}", file=sys.stderr)
                return 0
            cluster = Cluster.attach(args.state_dir)
            cluster.stop()
            print(f"stopped; logs kept in {cluster.logs}", file=sys.stderr)
        elif args.command == "env":
            cluster = Cluster.attach(args.state_dir)
            if not cluster.running():
                raise ClusterError(f"the cluster in {args.state_dir} is not running")
            _print_env(cluster)
    except ClusterError as err:
        print(f"cluster.py: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
