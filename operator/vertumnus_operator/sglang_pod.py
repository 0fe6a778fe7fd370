"""The engine container of a domain pod with ``engine.kind: sglang`` (pure: spec in, dict out).

One container holds all the domain's GPUs, as for the torch engine, and runs our
**adapter** (``vertumnus worker --engine sglang``), which starts one SGLang server
per worker of the grouping in force (read from the pod's downward-API ``degrees``
and ``workers`` files) and serves our ``Worker`` gRPC protocol on top of them, so
the router and the operator treat both engines alike. Keeping every server in one container is what
lets a split or merge restart only the affected servers (new ``--tp-size`` /
``--attn-cp-size``) and keep the pod, its GPUs and the node's page cache of the
weights; a container per server would need a new pod for every regroup.

What is rendered, and why:

- ``nvidia.com/gpu`` = the domain size; each server sees its own GPUs through
  ``CUDA_VISIBLE_DEVICES`` (the adapter sets it).
- ``/dev/shm``: a memory-backed emptyDir (:data:`SHM_SIZE`). A container's default
  64 MiB is too small for NCCL's shared-memory transport and SGLang's multiprocess
  tensors; NCCL then fails at the first collective.
- NCCL environment (:data:`NCCL_ENV`): warnings only; a CP group never leaves the
  NVLink domain, so NCCL is kept off InfiniBand (the RDMA NICs stay for the KV
  transfer engine, which uses its own verbs, not NCCL) and peer-to-peer is allowed
  over NVLink only. SGLang sets its own NCCL tunables (``NCCL_CUMEM_ENABLE``,
  ``NCCL_NVLS_ENABLE``; ``sglang/srt/entrypoints/engine.py:1885-1920``): not overridden.
- The model volume (``model.volume``: hostPath or PVC), read-only at ``model.path``.
- The KV transfer to the decode servers: ``engine.transfer.backend`` (SGLang's
  ``--disaggregation-transfer-backend``, default mooncake) and, with
  ``engine.transfer.rdma``, the RDMA NICs as the cluster's device plugin advertises
  them (``rdma/rdma_shared_device_a: 1``, say) plus ``CAP_IPC_LOCK``, which memory
  registration needs. Which resource names a cluster has is its own (NVIDIA's network
  operator, an SR-IOV plugin, …): nothing is requested unless the spec names one.
- Ports, per pod-local GPU r (a server is named by its worker's first GPU, so the
  ports of every grouping are declared once): ``rank-r`` = ``basePort + r``, the
  adapter's gRPC endpoint the router dials (as for torch); ``http-r`` = 30000 + r,
  SGLang's HTTP server; ``boot-r`` = 8998 + r, its disaggregation bootstrap server,
  which decode servers reach (hence ``--host 0.0.0.0``). KV events (5557 + r, replay
  5657 + r) and NCCL rendezvous (31000 + r) stay inside the container.
- Probes: the *startup* and *readiness* probes are gRPC probes of the adapter's
  rank-0 endpoint for the health of the pod as a whole (:data:`POD_HEALTH_SERVICE`,
  ``vertumnus.worker.v1.Pod``): SERVING once the first grouping's servers all
  answered ``/health``, and from then on while the adapter serves — through a
  regroup, which restarts servers for minutes, and with a failed worker. Per-worker
  state is not the kubelet's business: a draining, restarting or failed worker is
  NOT_SERVING in its own rank's ``Worker`` health and says why in ``Describe``; the
  routers stop placing there, and the operator replaces a failed worker with a
  ``replace`` transition (a new worker id in the same place, whose server the adapter
  starts). So a NotReady domain pod means what it says: the adapter is down or the
  node is lost, not that a server restarts. *Liveness* is a TCP check of the same
  port (the adapter's process, not its servers).

The port bases are the defaults of :mod:`vertumnus.worker.sglang.command` and are
passed explicitly on the adapter's command line (tests/operator/test_sglang_pod.py
checks they agree; the operator does not import the worker).
"""

from __future__ import annotations

import shlex
from typing import Any

from vertumnus.operator.crd import PoolSpec

__all__ = [
    "HTTP_BASE",
    "POD_HEALTH_SERVICE",
    "NCCL_ENV",
    "PORT_BASES",
    "SHM_SIZE",
    "adapter_command",
    "container",
    "volumes",
]

GPU_RESOURCE = "nvidia.com/gpu"  # = resources.GPU_RESOURCE (which imports this module)

PORT_BASES = {"http": 30000, "bootstrap": 8998, "events": 5557, "replay": 5657, "nccl": 31000}
"""SGLang servers' port bases in the pod (the server of the worker at GPU r adds r)."""
HTTP_BASE = PORT_BASES["http"]

SHM_SIZE = "16Gi"
"""The pod's /dev/shm (memory-backed; counts against the node's memory only when used)."""

NCCL_ENV = {
    "NCCL_DEBUG": "WARN",
    # CP groups stay inside the NVLink domain: no IB for NCCL, P2P over NVLink only.
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_LEVEL": "NVL",
}

POD_HEALTH_SERVICE = "vertumnus.worker.v1.Pod"
"""The adapter's gRPC health service for the pod as a whole (= vertumnus.worker.service.POD_SERVICE)."""

STARTUP_FAILURES = 90
"""Startup probe attempts, 10 s apart: 15 minutes to load the weights and capture graphs."""


def adapter_command(spec: PoolSpec, podinfo: str) -> list[str]:
    """``vertumnus worker --engine sglang`` for this pool, reading the grouping in force."""
    e, m = spec.engine, spec.model
    args = [
        "vertumnus",
        "worker",
        "--engine",
        "sglang",
        "--gpus-per-domain",
        str(spec.gpus_per_domain),
        "--degrees",
        f'"$(cat {podinfo}/degrees)"',
        "--worker-ids",
        f'"$(cat {podinfo}/workers)"',
        "--model",
        shlex.quote(m.path),
        "--served-model-name",
        shlex.quote(m.name),
        "--block-size",
        str(e.block_size),
        "--dtype",
        e.dtype,
        "--max-tokens",
        str(e.max_tokens),
        "--host",
        "0.0.0.0",
        "--grpc-base-port",
        str(e.base_port),
        "--http-base-port",
        str(PORT_BASES["http"]),
        "--bootstrap-base-port",
        str(PORT_BASES["bootstrap"]),
        "--events-base-port",
        str(PORT_BASES["events"]),
        "--replay-base-port",
        str(PORT_BASES["replay"]),
        "--nccl-base-port",
        str(PORT_BASES["nccl"]),
        "--transfer-backend",
        e.transfer_backend,
    ]
    # A shell reads the grouping in force at (re)start from the downward-API file.
    return ["sh", "-c", "exec " + " ".join(args)]


def _probe(port: int, failures: int) -> dict[str, Any]:
    return {
        "grpc": {"port": port, "service": POD_HEALTH_SERVICE},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def container(spec: PoolSpec, podinfo: str) -> dict[str, Any]:
    """The engine container (without the pool's common env and mounts: resources.py adds them)."""
    e = spec.engine
    g, base = spec.gpus_per_domain, e.base_port
    ports = [{"name": f"rank-{r}", "containerPort": base + r} for r in range(g)]
    ports += [{"name": f"http-{r}", "containerPort": HTTP_BASE + r} for r in range(g)]
    ports += [{"name": f"boot-{r}", "containerPort": PORT_BASES["bootstrap"] + r} for r in range(g)]
    limits = {GPU_RESOURCE: str(g)}
    body: dict[str, Any] = {
        "name": "engine",
        "image": e.image,
        "command": adapter_command(spec, podinfo),
        "env": [{"name": k, "value": v} for k, v in NCCL_ENV.items()],
        "ports": ports,
        "resources": {"limits": limits},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "startupProbe": _probe(base, STARTUP_FAILURES),
        "readinessProbe": _probe(base, 3),
        "livenessProbe": {"tcpSocket": {"port": base}, "periodSeconds": 10, "failureThreshold": 6},
    }
    if e.rdma_resource:
        # The RDMA NICs come from the cluster's device plugin; registering GPU memory
        # with them pins pages, which needs CAP_IPC_LOCK (an unlimited memlock).
        limits[e.rdma_resource] = str(e.rdma_count)
        body["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return body


def volumes(spec: PoolSpec) -> list[dict[str, Any]]:
    """The volumes only an SGLang pod has."""
    return [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
