"""The engine container of a domain pod with ``engine.kind: sglang`` (pure: spec in, dict out).

One container holds all the domain's GPUs, as for the torch engine, and runs our
**adapter** (``vertumnus worker --engine sglang``), which starts one SGLang server
per worker of the grouping in force (read from the pod's downward-API ``degrees``
file) and serves our ``Worker`` gRPC protocol on top of them, so the router and the
operator treat both engines alike. Keeping every server in one container is what
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
- Ports, per pod-local GPU r (a server is named by its worker's first GPU, so the
  ports of every grouping are declared once): ``rank-r`` = ``basePort + r``, the
  adapter's gRPC endpoint the router dials (as for torch); ``http-r`` = 30000 + r,
  SGLang's HTTP server; ``boot-r`` = 8998 + r, its disaggregation bootstrap server,
  which decode servers reach (hence ``--host 0.0.0.0``). KV events (5557 + r, replay
  5657 + r) and NCCL rendezvous (31000 + r) stay inside the container.
- Probes: a *startup* and a *readiness* probe run
  ``python3 -m vertumnus.worker.sglang.probe``, which asks every server of the
  grouping in force for ``/health`` (a kubelet probe names one port; there are up to
  domain-size servers). *Liveness* is a TCP check of the adapter's rank-0 port, not
  of the servers: a regroup restarts servers for minutes while the adapter lives,
  and the kubelet must not kill the container (every other worker) for that. The
  adapter does not restart a crashed server: it reports the worker unhealthy (its
  exit code and last output in every call's error) and a regroup that replaces the
  worker starts a new one.

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

STARTUP_FAILURES = 90
"""Startup probe attempts, 10 s apart: 15 minutes to load the weights and capture graphs."""
PROBE_TIMEOUT_S = 30
"""Per probe run: SGLang's /health gives up after 20 s (http_server.py:218), the probe's
own calls after 25 s."""


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
    ]
    # A shell reads the grouping in force at (re)start from the downward-API file.
    return ["sh", "-c", "exec " + " ".join(args)]


def _probe(podinfo: str, failures: int) -> dict[str, Any]:
    command = [
        "python3",
        "-m",
        "vertumnus.worker.sglang.probe",
        "--degrees-file",
        f"{podinfo}/degrees",
        "--http-base-port",
        str(HTTP_BASE),
        "--timeout",
        "25",
    ]
    return {
        "exec": {"command": command},
        "periodSeconds": 10,
        "timeoutSeconds": PROBE_TIMEOUT_S,
        "failureThreshold": failures,
    }


def container(spec: PoolSpec, podinfo: str) -> dict[str, Any]:
    """The engine container (without the pool's common env and mounts: resources.py adds them)."""
    g, base = spec.gpus_per_domain, spec.engine.base_port
    ports = [{"name": f"rank-{r}", "containerPort": base + r} for r in range(g)]
    ports += [{"name": f"http-{r}", "containerPort": HTTP_BASE + r} for r in range(g)]
    ports += [{"name": f"boot-{r}", "containerPort": PORT_BASES["bootstrap"] + r} for r in range(g)]
    return {
        "name": "engine",
        "image": spec.engine.image,
        "command": adapter_command(spec, podinfo),
        "env": [{"name": k, "value": v} for k, v in NCCL_ENV.items()],
        "ports": ports,
        "resources": {"limits": {GPU_RESOURCE: str(g)}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "startupProbe": _probe(podinfo, STARTUP_FAILURES),
        "readinessProbe": _probe(podinfo, 3),
        "livenessProbe": {"tcpSocket": {"port": base}, "periodSeconds": 10, "failureThreshold": 6},
    }


def volumes(spec: PoolSpec) -> list[dict[str, Any]]:
    """The volumes only an SGLang pod has."""
    return [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
