"""Each pool's NetworkPolicies, rendered by the operator wherever the pool lives.

A pool's routers can drain every worker or regroup the engines through their Admin port,
its managed Redis holds the prefix index, and its engines run whatever a router sends
them. With ``--pool-network-policies`` (the chart's ``networkPolicy.pools``) the operator
applies, beside the pool's other objects and owned by the CPPool:

``<pool>-routers``
    Prefill (the ``grpc`` port) from any client; the ``metrics`` port from the operator's
    ``metricsFrom`` peers (none given: any); the ``admin`` port from the operator's pods
    only (its namespace and pod labels, :class:`Peers`).
``<pool>-redis`` (a managed Redis only)
    6379 from the pool's routers only.
``<pool>-engines``
    every port from the pool's routers and engines (cross-domain KV copies); an SGLang
    pool's also from its decode servers (``spec.engine.transfer.from``; unset: from
    anywhere, since they must reach SGLang's bootstrap and transfer ports; ``[]``: none).

The selectors name this pool's pods (``vertumnus.io/pool``), so a pool's Redis and
engines take nothing from another pool's routers. Until 2026-12-06 the chart rendered
namespace-wide policies, only in the release namespace and ``operator.watchNamespaces``:
an operator that watched every namespace left the pools elsewhere open, and an SGLang
pool's engines refused their decode servers. Policies take effect only where the
cluster's network plugin enforces them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.operator import envnames
from vertumnus.operator import resources as res
from vertumnus.operator.crd import PoolSpec

__all__ = ["Peers", "peers_from", "policy_names", "pool_policies"]


@dataclass(frozen=True)
class Peers:
    """Who the pools' policies let in beside the pools' own pods."""

    operator_namespace: str
    operator_labels: Mapping[str, str] = field(hash=False)
    """The operator's pod labels (the chart's selector labels): its pods alone call the
    routers' Admin port."""
    metrics_from: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    """Who may scrape the routers' metrics port (NetworkPolicyPeers; empty: anyone)."""


def peers_from(enabled: bool, namespace: str, labels: str, metrics_from: str = "") -> Peers | None:
    """``--pool-network-policies`` and what it needs: the operator's namespace (the chart
    gives ``$POD_NAMESPACE``), its pod labels (``k=v,k=v``) and optionally who may scrape
    the routers (a JSON list of NetworkPolicyPeers). None: the pools get no policies."""
    if not enabled:
        return None
    if not namespace:
        raise ValueError(
            f"--pool-network-policies needs the operator's namespace (--operator-namespace or "
            f"${envnames.POD_NAMESPACE}): the routers' Admin port takes only the operator's pods"
        )
    pairs = [p.strip() for p in labels.split(",") if p.strip()]
    parsed = dict(p.split("=", 1) for p in pairs if "=" in p)
    if not pairs or len(parsed) != len(pairs) or not all(parsed) or not all(parsed.values()):
        raise ValueError(
            f"--operator-pod-labels (${envnames.OPERATOR_POD_LABELS}): expected the operator "
            f"pods' labels as k=v,k=v, got {labels!r}"
        )
    peers: tuple[Mapping[str, Any], ...] = ()
    if metrics_from.strip():
        try:
            raw = json.loads(metrics_from)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"--router-metrics-from (${envnames.ROUTER_METRICS_FROM}): not JSON: {e}"
            ) from None
        if not isinstance(raw, list) or not all(isinstance(p, dict) and p for p in raw):
            raise ValueError(
                f"--router-metrics-from (${envnames.ROUTER_METRICS_FROM}): expected a JSON list of "
                f"NetworkPolicyPeers, got {metrics_from!r}"
            )
        peers = tuple(raw)
    return Peers(namespace, parsed, peers)


def _policy(owner: res.Owner, name: str, component: str, selects: Mapping[str, str],
            ingress: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owner.meta(name, component),
        "spec": {
            "podSelector": {"matchLabels": dict(selects)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _pods(labels: Mapping[str, str]) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": dict(labels)}}


def _tcp(*ports: int | str) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def policy_names(owner: res.Owner) -> tuple[str, str, str]:
    """The routers', the managed Redis' and the engines' policy names."""
    return f"{owner.name}-routers", f"{owner.name}-redis", f"{owner.name}-engines"


def pool_policies(spec: PoolSpec, owner: res.Owner, peers: Peers) -> list[dict[str, Any]]:
    """The pool's policies (the Redis one only with a managed Redis)."""
    routers_name, redis_name, engines_name = policy_names(owner)
    routers = res.router_labels(owner)
    engines = res.engine_labels(owner)
    metrics: dict[str, Any] = {"ports": _tcp("metrics")}
    if peers.metrics_from:
        metrics["from"] = [dict(p) for p in peers.metrics_from]
    operator = {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": peers.operator_namespace}
        },
        "podSelector": {"matchLabels": dict(peers.operator_labels)},
    }
    out = [
        _policy(
            owner,
            routers_name,
            "router",
            routers,
            [{"ports": _tcp("grpc")}, metrics, {"ports": _tcp("admin"), "from": [operator]}],
        )
    ]
    if spec.redis.mode == "managed":
        redis = {res.LABEL_POOL: owner.name, res.LABEL_COMPONENT: "redis"}
        out.append(
            _policy(
                owner, redis_name, "redis", redis, [{"from": [_pods(routers)], "ports": _tcp(6379)}]
            )
        )
    ingress: list[dict[str, Any]] = [{"from": [_pods(routers), _pods(engines)]}]
    decode: Sequence[Mapping[str, Any]] | None = spec.engine.transfer_from
    if spec.engine.kind == "sglang" and decode is None:
        ingress.append({})  # a rule without "from" takes every source
    elif spec.engine.kind == "sglang" and decode:
        # Never an empty "from": Kubernetes reads it as every source, not none.
        ingress.append({"from": [dict(p) for p in decode]})
    out.append(_policy(owner, engines_name, "engine", engines, ingress))
    return out
