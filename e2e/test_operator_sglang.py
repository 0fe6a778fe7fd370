"""The operator over an SGLang pool: a server that exits is replaced in its place.

The CPPool asks for ``engine.kind: sglang``; its domain pod is a fake pod on a kwok node,
as in the rest of the operator's e2e, and the pool behind it runs as local processes:
the SGLang adapter (``vertumnus worker --engine sglang``, exactly what the pod runs) over
stand-in SGLang servers (``tests/worker/sglang_standin.py``: SGLang's HTTP and ZMQ
surface, and faults on demand), and a ``vertumnus router`` started from the very
``router.json`` the operator rendered. One stand-in server is made to crash with no
request in flight; the router learns it from the worker's event stream and reports it
FAILED; the operator, a real process, replaces the worker through the router's Admin
API (a ``replace`` transition: the same GPU, a new worker id), and the adapter starts a
new server there. The pod is the same throughout and stays Ready.
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.request
from pathlib import Path

import e2e_operator_support as ops
import e2e_pool_support as ps
import grpc
import pytest
from e2e_operator_support import cppool, engine_pods, events, gpu_nodes, pool_status, wait_for

from vertumnus._proto import pool_pb2, pool_pb2_grpc

pytest.importorskip("zmq", reason="the SGLang adapter's event subscriber needs pyzmq")

STANDIN = Path(__file__).resolve().parents[1] / "tests" / "worker" / "sglang_standin.py"


class Adapter(ps.Engine):
    """``vertumnus worker --engine sglang`` over stand-in servers, as a process (the torch
    engine's helper with the adapter's command: the same ports, start and stop)."""

    def __init__(self, degrees: list[int], worker_ids: list[int], model: Path, log: Path) -> None:
        world = sum(degrees)
        super().__init__(
            world, degrees, log, worker_ids=worker_ids, base_port=ps.free_base(6 * world)
        )
        self.model = model
        self.http_base = self.base_port + world

    def command(self) -> list[str]:
        w, base = self.ranks, self.base_port
        return [
            sys.executable, "-m", "vertumnus", "worker", "--engine", "sglang",
            "--degrees", ",".join(map(str, self.degrees)),
            "--worker-ids", ",".join(map(str, self.worker_ids or ())),
            "--model", str(self.model), "--block-size", str(self.block_size),
            "--max-tokens", str(self.max_tokens),
            "--launcher", f"{sys.executable} {STANDIN}",
            "--grpc-base-port", str(base), "--http-base-port", str(self.http_base),
            "--bootstrap-base-port", str(base + 2 * w),
            "--events-base-port", str(base + 3 * w),
            "--replay-base-port", str(base + 4 * w),
            "--nccl-base-port", str(base + 5 * w),
            "--health-timeout", "30",
        ]  # fmt: skip

    def crash(self, offset: int, code: int) -> None:
        """Make the stand-in server of the worker at GPU ``offset`` exit with ``code``."""
        body = json.dumps({"crash": code}).encode()
        url = f"http://127.0.0.1:{self.http_base + offset}/standin/control"
        with contextlib.suppress(OSError):  # it may die before it answers
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5).read()

    def server_pid(self, offset: int) -> int:
        url = f"http://127.0.0.1:{self.http_base + offset}/get_server_info"
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(json.loads(r.read())["standin"]["pid"])


def _prefill_all(address: str, n: int) -> list[pool_pb2.PrefillResponse]:
    with grpc.insecure_channel(address) as ch:
        stub = pool_pb2_grpc.PrefillStub(ch)
        futures = [
            stub.Prefill.future(
                pool_pb2.PrefillRequest(
                    request_id=f"p{i}", token_ids=[(i * 31 + 7 * j) % 256 for j in range(40)]
                ),
                timeout=60,
            )
            for i in range(n)
        ]
        return [f.result() for f in futures]


def test_a_failed_sglang_server_is_replaced_by_the_operator_in_the_same_pod(
    k8s, operator, namespace, tmp_path
) -> None:
    name = "sg"
    with gpu_nodes(k8s, 1, gpus=2) as label:
        ops.apply(
            k8s,
            cppool(
                name,
                namespace,
                2,
                label,
                gpusPerDomain=2,
                degrees=[1, 2],
                composition=[{"count": 2, "degree": 1}],
                engine={"kind": "sglang"},
                model={"profile": "cpu-tiny", "path": "/models/tiny"},
                router={"adminTLS": True},  # the stand-in routers' pools do without
            ),
        )

        def ready():  # type: ignore[no-untyped-def]
            st = pool_status(k8s, namespace, name)
            return st if st.get("phase") == "Ready" and st.get("composition") == "2xCP1" else None

        try:
            wait_for("Ready", 60, ready)
        except AssertionError:
            raise AssertionError(f"not Ready: {pool_status(k8s, namespace, name)}") from None
        (pod,) = engine_pods(k8s, namespace, name)
        (engine,) = pod["spec"]["containers"]
        # The API server took the pod's gRPC probes of the adapter's pod health.
        assert engine["readinessProbe"]["grpc"]["service"] == "vertumnus.worker.v1.Pod"
        assert engine["startupProbe"]["grpc"]["port"] == 50051
        config = ops.pool_router_json(k8s, namespace, name, tmp_path)
        assert config["engine"]["kind"] == "sglang"
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"vocab_size": 256}))

        ids = [w["id"] for w in pool_status(k8s, namespace, name)["workers"]]
        adapter = Adapter([1, 1], ids, model, tmp_path / "adapter.log").start(60)
        router = None
        try:
            router = ps.RouterProcess(
                [adapter.address],
                tmp_path / "router.log",
                "--config",
                str(tmp_path / "router.json"),
                admin_port=True,
                admin_tls=ops.pool_admin_tls(operator.kubeconfig, namespace, name),
            ).start()
            k8s.kubectl(
                "annotate",
                "cppool",
                name,
                "-n",
                namespace,
                f"vertumnus.io/router-addresses={router.admin_address}",
            )
            assert {r.worker for r in _prefill_all(router.address, 8)} == set(ids)
            kept_pid = adapter.server_pid(0)

            adapter.crash(1, 7)  # no request in flight: nobody asks the worker anything

            def replaced():  # type: ignore[no-untyped-def]
                st = pool_status(k8s, namespace, name)
                last = st.get("lastTransition") or {}
                return st if last.get("kind") == "replace" and st.get("phase") == "Ready" else None

            try:
                st = wait_for("the replacement", 60, replaced)
            except AssertionError:
                raise AssertionError(
                    f"not replaced: {pool_status(k8s, namespace, name)}; "
                    f"events: {[e.get('message') for e in events(k8s, namespace, name)]}"
                ) from None
            last = st["lastTransition"]
            assert last["removed"] == [ids[1]] and "exited with code 7" in last["reason"]
            (new,) = last["added"]
            assert new not in ids
            assert [(w["id"], w["offset"]) for w in st["workers"]] == [(ids[0], 0), (new, 1)]
            assert st["composition"] == "2xCP1" and st["epoch"] == 2
            said = [(e["reason"], e.get("message", "")) for e in events(k8s, namespace, name)]
            assert any(r == "WorkerFailed" and "exited with code 7" in m for r, m in said), said
            # The router and the adapter agree with the status; the new server serves.
            seen = ps.pool(
                router.admin_address, token_file=tmp_path / "admin-token", tls=router.admin_tls
            )
            assert seen.epoch == 2 and [w.worker for w in seen.workers] == [ids[0], new]
            assert all(w.state == pool_pb2.WorkerStatus.SERVING for w in seen.workers)
            assert {r.worker for r in _prefill_all(router.address, 8)} == {ids[0], new}
            assert adapter.server_pid(0) == kept_pid  # the other worker's server untouched
            # The same pod throughout, Ready, and no WorkerFailed condition left.
            (again,) = engine_pods(k8s, namespace, name)
            assert again["metadata"]["uid"] == pod["metadata"]["uid"]

            def healed():  # type: ignore[no-untyped-def]
                conds = pool_status(k8s, namespace, name).get("conditions") or []
                degraded = next((c for c in conds if c["type"] == "Degraded"), None)
                return degraded is not None and degraded["status"] == "False"

            wait_for("Degraded cleared", 30, healed)
        finally:
            if router is not None:
                router.stop()
            adapter.stop()
        k8s.kubectl("delete", "cppool", name, "-n", namespace, "--timeout=30s")
