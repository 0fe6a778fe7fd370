"""The operator driving a real pool: transitions that move real requests.

The rest of the operator's e2e talks to a stand-in router. Here the CPPool's domain pod
is a fake pod on a kwok node, as there, but the pool behind it is real and runs as local
processes: a ``vertumnus serve`` engine of 4 CPU ranks (the domain's 4 "GPUs") and a
``vertumnus router`` started from the very ``router.json`` the operator rendered into the
pool's ConfigMap (only the engine's address and the listen port are replaced: the pod
DNS names do not resolve outside a cluster; and the Admin token's file, written from the
pool's Secret as the pod would mount it: the router refuses the operator's calls without
that token). The operator, a real process under the
chart's ServiceAccount, splits and merges the worker through the router's Admin API
while clients send requests; every request must be answered exactly once, with the
first token the engine gives at any degree, and the pod must stay the same. It finds
that router as in a deployment, as the one endpoint of the pool's router Service (an
EndpointSlice the test makes); the rolling update's test points it there by annotation.
"""

from __future__ import annotations

import asyncio
import threading
import time

import e2e_operator_support as ops
import e2e_pool_support as ps
import grpc
import pytest
from e2e_operator_support import (
    condition,
    cppool,
    engine_pods,
    gpu_nodes,
    pool_status,
    wait_for,
)

from vertumnus._proto import pool_pb2, pool_pb2_grpc


def _composition(k8s, ns, name, want):  # type: ignore[no-untyped-def]
    def probe():  # type: ignore[no-untyped-def]
        st = pool_status(k8s, ns, name)
        return st if st.get("phase") == "Ready" and st.get("composition") == want else None

    return probe


class _Clients:
    """Open-loop clients in a thread of their own: ``prompts`` sent every ``gap_s``."""

    def __init__(self, address: str, prompts: list[list[int]], gap_s: float) -> None:
        self.address = address
        self.prompts = prompts
        self.gap_s = gap_s
        self.answers: dict[str, pool_pb2.PrefillResponse] = {}
        self.errors: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as ch:
            stub = pool_pb2_grpc.PrefillStub(ch)

            async def one(i: int, tokens: list[int]) -> None:
                await asyncio.sleep(i * self.gap_s)
                rid = f"k{i}"
                try:
                    r = await stub.Prefill(
                        pool_pb2.PrefillRequest(request_id=rid, token_ids=tokens), timeout=120
                    )
                except grpc.aio.AioRpcError as e:
                    self.errors.append(f"{rid}: {e.code().name}: {e.details()}")
                    return
                if rid in self.answers:
                    self.errors.append(f"{rid}: answered twice")
                self.answers[rid] = r

            await asyncio.gather(*(one(i, t) for i, t in enumerate(self.prompts)))


def _one_domain_pool(k8s, ns, name, label, tmp_path):  # type: ignore[no-untyped-def]
    """A CPPool of one 4-"GPU" domain (the cpu-tiny profile covers degrees 1, 2, 4),
    moved only by hand, Ready as 1xCP4; its pod's UIDs and the router.json it
    rendered, written to ``tmp_path`` with the Admin token of the pool's Secret."""
    ops.apply(
        k8s,
        cppool(
            name,
            ns,
            4,
            label,
            gpusPerDomain=4,
            degrees=[2, 4],
            model={"profile": "cpu-tiny"},
            controller={"windowSeconds": 3600},  # only the operator's own moves
            router={"adminTLS": True},  # the stand-in routers' pools do without
        ),
    )
    try:
        wait_for("Ready", 60, _composition(k8s, ns, name, "1xCP4"))
    except AssertionError:
        raise AssertionError(f"not Ready: {pool_status(k8s, ns, name)}") from None
    uids = [p["metadata"]["uid"] for p in engine_pods(k8s, ns, name)]
    ops.pool_router_json(k8s, ns, name, tmp_path)
    return uids


def _route(k8s, ns, name, engine, tmp_path, operator, *, via_service=False):  # type: ignore[no-untyped-def]
    """A router from the pool's router.json in front of ``engine``, and the operator
    pointed at it: by the CPPool's ``vertumnus.io/router-addresses`` annotation, or
    (``via_service``) as in a deployment, where the operator reads the ready endpoints of
    the pool's ``<name>-router`` Service. The chart's router pods are kwok's fakes, so
    their Deployment is scaled to 0 and an EndpointSlice of the Service names the test's
    router, which then listens on this machine's own address instead of the loopback."""
    router = ps.RouterProcess(
        [engine.address],
        tmp_path / "router.log",
        "--config",
        str(tmp_path / "router.json"),
        host=ops.own_address() if via_service else "127.0.0.1",
        admin_port=True,  # Admin on a port of its own, as router.json's adminPort in a pod
        # Over TLS, with the certificate the operator issued the pool's routers.
        admin_tls=ops.pool_admin_tls(operator.kubeconfig, ns, name),
    ).start()
    if not via_service:
        k8s.kubectl(
            "annotate", "cppool", name, "-n", ns,
            f"vertumnus.io/router-addresses={router.admin_address}",
        )  # fmt: skip
        return router
    ops.stop_router_pods(k8s, ns, name)
    ops.add_router_endpoint(k8s, ns, name, router.host, grpc=router.port, admin=router.admin_port)

    def routed():  # type: ignore[no-untyped-def]
        st = pool_status(k8s, ns, name)
        return st.get("phase") == "Ready" and condition(st, "Degraded").get("status") == "False"

    # The pool is Degraded (RouterUnavailable) while no router has an address, if a step
    # looked then, and Ready again once the test's has one.
    wait_for("the pool routed through its Service", 60, routed)
    return router


def test_a_split_and_a_merge_by_the_operator_move_real_requests_and_lose_none(
    k8s, operator, namespace, tmp_path
) -> None:
    with gpu_nodes(k8s, 1, gpus=4) as label:
        uids = _one_domain_pool(k8s, namespace, "real", label, tmp_path)
        # Worker 0 of degree 4 over ranks 0-3, epoch 1: what the CPPool's status says.
        engine = ps.Engine(4, [4], tmp_path / "engine.log", worker_ids=[0]).start()
        router = None
        try:
            router = _route(k8s, namespace, "real", engine, tmp_path, operator, via_service=True)
            prompts = ps.prompts(160, seed=21, extra=60)
            clients = _Clients(router.address, prompts, gap_s=0.05)  # ~8 s of requests
            clients.thread.start()
            time.sleep(1.0)
            k8s.kubectl("annotate", "cppool", "real", "-n", namespace, "vertumnus.io/split=0")
            st = wait_for("the split", 60, _composition(k8s, namespace, "real", "2xCP2"))
            a, b = (w["id"] for w in st["workers"])
            time.sleep(2.0)  # requests on the CP2 workers
            k8s.kubectl(
                "annotate", "cppool", "real", "-n", namespace, f"vertumnus.io/merge={a},{b}"
            )
            st = wait_for("the merge", 60, _composition(k8s, namespace, "real", "1xCP4"))
            clients.thread.join(180)
            assert not clients.thread.is_alive(), "clients still waiting after 180 s"

            # Nothing lost, nothing twice.
            assert clients.errors == []
            assert sorted(clients.answers) == sorted(f"k{i}" for i in range(len(prompts)))
            degrees = {r.degree for r in clients.answers.values()}
            assert degrees == {2, 4}, degrees
            # The router and the engine are where the operator's status says.
            token, tls = tmp_path / "admin-token", router.admin_tls
            seen = ps.pool(router.admin_address, token_file=token, tls=tls)
            # The operator reached Admin at its own port; the clients' port does not serve it.
            with pytest.raises(grpc.RpcError) as refused:
                ps.pool(router.address, token_file=token)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            # And only over TLS, with the pool's token, which the operator sent on every call.
            with pytest.raises(grpc.RpcError) as refused:
                ps.pool(router.admin_address, tls=tls)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as refused:
                ps.pool(router.admin_address, token_file=token)  # plaintext
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert seen.epoch == st["epoch"] == 3
            assert seen.composition == "1xCP4"
            assert [w.worker for w in seen.workers] == [w["id"] for w in st["workers"]]
            # The first tokens are the model's at every degree (the merged CP4 worker
            # recomputes a sample of them, cache bypassed by fresh request ids).
            for i in range(0, len(prompts), 20):
                want = engine.first_token(0, prompts[i], f"check{i}")
                assert clients.answers[f"k{i}"].first_token_id == want, i
            # The same pod throughout.
            assert [p["metadata"]["uid"] for p in engine_pods(k8s, namespace, "real")] == uids
        finally:
            if router is not None:
                router.stop()
            engine.stop()
        k8s.kubectl("delete", "cppool", "real", "-n", namespace, "--timeout=30s")


def test_a_rolling_update_restarts_the_engine_and_loses_no_request(
    k8s, operator, namespace, tmp_path
) -> None:
    # The same pool of one domain. A new engine image: the operator drains the worker at
    # the router, deletes the pod and resumes the worker once the new pod is ready. The
    # test plays the kubelet: while the old pod terminates, its engine process stops and
    # the new pod's starts (a new incarnation, its cache empty). kwok removes a deleted pod
    # and readies its successor at once, faster than the test can look, so a finalizer
    # holds the old pod Terminating until the engine has restarted, as a kubelet's
    # graceful termination does. Requests sent meanwhile wait at the router.
    with gpu_nodes(k8s, 1, gpus=4) as label:
        (uid,) = _one_domain_pool(k8s, namespace, "roll", label, tmp_path)
        (pod,) = [p["metadata"]["name"] for p in engine_pods(k8s, namespace, "roll")]
        ops.hold_pod(k8s, namespace, pod)
        engine = ps.Engine(4, [4], tmp_path / "engine.log", worker_ids=[0]).start()
        router = None
        try:
            router = _route(k8s, namespace, "roll", engine, tmp_path, operator)
            prompts = ps.prompts(100, seed=22, extra=60)
            clients = _Clients(router.address, prompts, gap_s=0.05)
            clients.thread.start()
            time.sleep(1.0)
            ops.set_engine_image(k8s, namespace, "roll")

            def terminating():  # type: ignore[no-untyped-def]
                old = [
                    p for p in engine_pods(k8s, namespace, "roll") if p["metadata"]["uid"] == uid
                ]
                return bool(old and old[0]["metadata"].get("deletionTimestamp"))

            wait_for("the old pod deleted", 60, terminating)
            # The operator drains first and resumes only once the new pod is Ready, which
            # cannot be before the old one is gone: the worker must be draining now.
            assert (
                ps.pool(
                    router.admin_address, token_file=tmp_path / "admin-token", tls=router.admin_tls
                )
                .workers[0]
                .state
                == pool_pb2.WorkerStatus.DRAINING
            ), "the pod went before its worker was drained"
            engine.stop()  # the kubelet stops the old pod's engine and starts the new one's
            engine.start()
            ops.release_pod(k8s, namespace, pod)

            def serving():  # type: ignore[no-untyped-def]
                st = pool_status(k8s, namespace, "roll")
                token = tmp_path / "admin-token"
                w = ps.pool(router.admin_address, token_file=token, tls=router.admin_tls).workers[0]
                return st.get("phase") == "Ready" and w.state == pool_pb2.WorkerStatus.SERVING

            wait_for("the worker serving again", 60, serving)
            clients.thread.join(180)
            assert not clients.thread.is_alive(), "clients still waiting after 180 s"
            assert clients.errors == []
            assert sorted(clients.answers) == sorted(f"k{i}" for i in range(len(prompts)))
            # Answers from before and after the restart are the model's.
            for i in range(0, len(prompts), 20):
                want = engine.first_token(0, prompts[i], f"check{i}")
                assert clients.answers[f"k{i}"].first_token_id == want, i
            reasons = [e["reason"] for e in ops.events(k8s, namespace, "roll")]
            assert "DomainPodReplaced" in reasons, reasons
        finally:
            ops.release_pod(k8s, namespace, pod)
            if router is not None:
                router.stop()
            engine.stop()
        k8s.kubectl("delete", "cppool", "roll", "-n", namespace, "--timeout=30s")
