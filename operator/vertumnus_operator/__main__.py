"""``python -m vertumnus.operator``: run the operator, print its CRDs, render a pool.

::

    python -m vertumnus.operator run --admin-key-file PATH [--namespace NS ...] [--standalone]
                                     [--priority N] [--peering NAME] [--liveness URL]
                                     [--metrics-listen HOST:PORT] [--verbose]
    python -m vertumnus.operator crds [--write]      # print the CRDs; --write refreshes crds/'s copies
    python -m vertumnus.operator render -f cppool.yaml [--uid UID] [--admin-key-file PATH]
                                      # the objects a CPPool becomes

``run`` needs the operator's key (``--admin-key-file``, default ``$VERTUMNUS_ADMIN_KEY_FILE``):
each pool's Admin token is derived from it (:mod:`vertumnus.admintoken`). It watches
CPPools in every namespace (or only the ``--namespace`` ones) with kopf.
Peering (on unless ``--standalone``): replicas share the peering object ``--peering``
(``ClusterKopfPeering``, or ``KopfPeering`` per namespace with ``--namespace``) and only
the one with the highest priority acts. The priority defaults to a number derived from
the pod name ($POD_NAME, else the host name), so two replicas of a Deployment differ and
exactly one acts; equal priorities would make kopf pause both (never both act).

``crds`` prints the CRDs the package ships (``vertumnus/operator/crds/``, package data),
so it works from an installed wheel, where the repository's ``crds/`` does not exist.
``crds/`` stays the single source of truth: in a checkout, ``--write`` copies it into
the package and into the Helm chart (tests/operator/test_crd.py fails if they drift).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vertumnus.operator import adminkeys, envnames

__all__ = ["default_priority", "main"]

ROOT = Path(__file__).resolve().parents[2]
"""The repository root, when running from a checkout (an installed package has none)."""
CRDS = ROOT / "crds"
CHART_CRDS = ROOT / "deploy" / "helm" / "vertumnus" / "crds"
PACKAGE_CRDS = Path(__file__).resolve().parent / "crds"
"""The copy shipped in the package (checkout path; read through importlib.resources)."""


def default_priority(identity: str | None = None) -> int:
    """A stable per-replica priority in [1, 2**31): from $POD_NAME or the host name."""
    ident = identity or os.environ.get(envnames.POD_NAME) or os.uname().nodename
    return 1 + zlib.crc32(ident.encode()) % (2**31 - 1)


def _run(args: argparse.Namespace) -> int:
    import kopf

    from vertumnus.operator.handlers import configure, register
    from vertumnus.operator.pool import record_looks_every

    try:
        admin_key, admin_ca = adminkeys.load(
            args.admin_key_file, args.admin_ca_file, args.admin_ca_key_file
        )
        record_looks_s = record_looks_every(args.record_looks_every)
        policies = _policies(args)
    except ValueError as e:
        print(f"vertumnus operator: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    registry = kopf.OperatorRegistry()
    register(registry)
    settings = kopf.OperatorSettings()
    configure(settings, args.peering_lifetime)
    priority = args.priority if args.priority is not None else default_priority()
    logging.getLogger("vertumnus.operator").info(
        "operator starting: %s, peering %s, priority %d",
        "namespaces " + ",".join(args.namespace) if args.namespace else "all namespaces",
        "off" if args.standalone else args.peering,
        priority,
    )
    if admin_ca is None:
        logging.getLogger("vertumnus.operator").warning(
            "no admin CA (--admin-ca-file, --admin-ca-key-file): the routers' Admin ports "
            "serve plaintext, and the token crosses the network in clear"
        )
    memo = kopf.Memo(
        admin_key=admin_key, admin_ca=admin_ca, record_looks_s=record_looks_s, policies=policies
    )
    if args.metrics_listen:
        memo["metrics"] = _serve_metrics(args.metrics_listen)
    from vertumnus.gcfreeze import freeze_startup

    # kopf, the Kubernetes client and the core (~87,000 objects, 26 ms a walk), out of
    # every full collection's walk: one would otherwise land in some decision tick.
    freeze_startup()
    kopf.run(
        registry=registry,
        settings=settings,
        standalone=args.standalone,
        priority=priority,
        peering_name=None if args.standalone else args.peering,
        liveness_endpoint=args.liveness,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        memo=memo,
    )
    return 0


def _add_admin_ca_flags(p: argparse.ArgumentParser, env: bool) -> None:
    for flag, var, what in (
        ("--admin-ca-file", envnames.ADMIN_CA_FILE, "certificate"),
        ("--admin-ca-key-file", envnames.ADMIN_CA_KEY_FILE, "key"),
    ):
        p.add_argument(
            flag,
            default=os.environ.get(var, "") if env else "",
            metavar="PATH",
            help=f"the CA's PEM {what}: the operator issues each pool's routers a certificate "
            "for their Admin port and verifies it"
            + (
                f" (default ${var}; the chart's Secret <release>-vertumnus-operator-admin-key)"
                if env
                else ""
            ),
        )


def _add_policy_flags(p: argparse.ArgumentParser, env: bool) -> None:
    """The flags of each pool's NetworkPolicies (:mod:`vertumnus.operator.networkpolicy`);
    ``env``: their defaults from the environment the chart sets."""

    def default(var: str) -> str:
        return os.environ.get(var, "") if env else ""

    p.add_argument(
        "--pool-network-policies",
        action="store_true",
        default=default(envnames.POOL_NETWORK_POLICIES) == "true",
        help="give every pool NetworkPolicies of its own, in whatever namespace it lives: its "
        "routers' Admin port only from the operator's pods, its Redis only from its routers, "
        "its engines only from its routers and engines (and an SGLang pool's decode servers, "
        "spec.engine.transfer.from); needs --operator-pod-labels and the operator's namespace"
        + (f" (default ${envnames.POOL_NETWORK_POLICIES}=true)" if env else ""),
    )
    p.add_argument(
        "--operator-namespace",
        default=default(envnames.POD_NAMESPACE),
        help="the operator's own namespace"
        + (f" (default ${envnames.POD_NAMESPACE})" if env else ""),
    )
    p.add_argument(
        "--operator-pod-labels",
        default=default(envnames.OPERATOR_POD_LABELS),
        metavar="K=V,...",
        help="labels of the operator's pods: the only pods the routers' Admin port takes"
        + (f" (default ${envnames.OPERATOR_POD_LABELS})" if env else ""),
    )
    p.add_argument(
        "--router-metrics-from",
        default=default(envnames.ROUTER_METRICS_FROM),
        metavar="JSON",
        help="who may scrape the routers' metrics port: a JSON list of NetworkPolicyPeers "
        "(empty: anyone" + (f"; default ${envnames.ROUTER_METRICS_FROM})" if env else ")"),
    )


def _policies(args: argparse.Namespace) -> Any:
    """The flags' :class:`~vertumnus.operator.networkpolicy.Peers` (None: no policies);
    ValueError names a bad flag."""
    from vertumnus.operator import networkpolicy as netpol

    return netpol.peers_from(
        args.pool_network_policies,
        args.operator_namespace,
        args.operator_pod_labels,
        args.router_metrics_from,
    )


def _serve_metrics(listen: str) -> object:
    """The operator's metrics, served on ``listen`` (HOST:PORT)."""
    from vertumnus.operator.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    try:
        port = metrics.serve(listen)
    except ValueError as e:
        raise SystemExit(f"vertumnus operator: error: {e}") from None
    host = listen.rpartition(":")[0] or "0.0.0.0"
    logging.getLogger("vertumnus.operator").info("metrics: http://%s:%d/metrics", host, port)
    return metrics


def _crds(args: argparse.Namespace) -> int:
    from vertumnus.operator.crdcheck import packaged_crds

    if args.write:
        return _write_crds()
    crds = packaged_crds()
    if not crds:  # a broken install: say so instead of printing nothing
        print("vertumnus operator: error: no CRDs in the installed package", file=sys.stderr)
        return 1
    for _, text in crds:
        sys.stdout.write(text)
    return 0


def _write_crds() -> int:
    """Copy crds/*.yaml (the source of truth) to the chart's and the package's copies."""
    files = sorted(CRDS.glob("*.yaml"))
    if not files:
        print(
            f"vertumnus operator: error: crds --write refreshes a checkout's copies, and there "
            f"is no {CRDS} here (an installed package?)",
            file=sys.stderr,
        )
        return 2
    for target in (CHART_CRDS, PACKAGE_CRDS):
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, target / f.name)
            print(f"wrote {target / f.name}")
    return 0


def _render(args: argparse.Namespace) -> int:
    import yaml

    from vertumnus.admintls import pool_certificate
    from vertumnus.admintoken import pool_token
    from vertumnus.core import transition as tr
    from vertumnus.core.lattice import layout_for
    from vertumnus.operator import resources as res
    from vertumnus.operator.crd import SpecError, parse_spec
    from vertumnus.operator.gang import backend_for
    from vertumnus.operator.reconcile import pool_objects

    try:
        admin_key, admin_ca = adminkeys.load(
            args.admin_key_file, args.admin_ca_file, args.admin_ca_key_file, need_key=False
        )
        policies = _policies(args)
    except ValueError as e:
        print(f"vertumnus operator: error: {e}", file=sys.stderr)
        return 2
    if admin_ca is not None and admin_key is None:
        print("vertumnus operator: error: --admin-ca-file needs --admin-key-file", file=sys.stderr)
        return 2
    docs = [d for d in yaml.safe_load_all(Path(args.file).read_text()) if d]
    items = []
    for doc in docs:
        if doc.get("kind") != "CPPool":
            continue
        meta = doc.get("metadata") or {}
        try:
            spec = parse_spec(doc.get("spec") or {})
        except SpecError as e:
            print(f"{args.file}: {meta.get('name')}: {e}", file=sys.stderr)
            return 2
        owner = res.Owner(
            meta["name"], args.namespace or meta.get("namespace") or "default", args.uid
        )
        pool = tr.initial_pool(layout_for(spec.initial_composition(), spec.gpus_per_domain))
        gang = backend_for(spec.gang.backend, spec.gang.queue)
        group = res.gang_group(spec, owner, gang)
        if group is not None:
            items.append(group)
        tls_on = admin_ca is not None and spec.router.admin_tls
        items += pool_objects(spec, owner, pool.layout, pool.epoch, tls_on, policies)
        if admin_key is not None:
            token = pool_token(admin_key, owner.namespace, owner.name, owner.uid)
            tls = None
            if admin_ca is not None and tls_on:
                now = datetime.datetime.now(datetime.UTC)
                o = owner
                issued = pool_certificate(admin_ca, admin_key, o.namespace, o.name, o.uid, now)
                tls = (issued.cert_pem, issued.key_pem)
            items.append(res.admin_secret(owner, token, tls))
        if spec.redis.mode == "managed":
            items.append(res.redis_secret(owner, "rendered-placeholder"))
        items += [
            res.domain_pod(spec, owner, d, pool.layout.domain(d), pool.epoch, gang)
            for d in range(spec.domains)
        ]
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vertumnus.operator", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the operator (kopf)")
    r.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all)",
    )
    r.add_argument(
        "--admin-key-file",
        default=os.environ.get(envnames.ADMIN_KEY_FILE, ""),
        metavar="PATH",
        help="the operator's key (at least 16 bytes): each pool's Admin token is derived from "
        f"it (default ${envnames.ADMIN_KEY_FILE}; the chart mounts its Secret <release>-vertumnus-operator-admin-key)",
    )
    _add_admin_ca_flags(r, env=True)
    r.add_argument(
        "--record-looks-every",
        default=os.environ.get(envnames.RECORD_LOOKS_EVERY, ""),
        metavar="SECONDS",
        help="write a controller look that decides nothing into the CPPool's status at most "
        f"this often (default 30; ${envnames.RECORD_LOOKS_EVERY}): each write is a PATCH that "
        "etcd keeps and every CPPool watcher receives, and a look comes every 2.5 s. A look "
        "that starts a split or merge, or changes what the controller decided, is written at "
        "once; a restarted operator loses at most these seconds of looks. 0: every look",
    )
    _add_policy_flags(r, env=True)
    r.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    r.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority (default: derived from $POD_NAME / the host name)",
    )
    r.add_argument(
        "--peering",
        default=os.environ.get(envnames.PEERING, "vertumnus"),
        help="peering object name (default vertumnus)",
    )
    r.add_argument(
        "--peering-lifetime",
        type=int,
        default=None,
        help="seconds before a silent peer counts as gone (kopf default 60)",
    )
    r.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    r.add_argument(
        "--metrics-listen",
        default="",
        help="HOST:PORT of the Prometheus /metrics endpoint, e.g. 0.0.0.0:9464 (default: none)",
    )
    r.add_argument("--verbose", action="store_true")
    c = sub.add_parser("crds", help="print the CRDs (the package's copy of crds/*.yaml)")
    c.add_argument(
        "--write",
        action="store_true",
        help="in a checkout: copy crds/*.yaml into the Helm chart's crds/ and the package's",
    )
    d = sub.add_parser("render", help="print the objects a CPPool renders to (a List, JSON)")
    d.add_argument("-f", "--file", required=True)
    d.add_argument("--namespace", default=None)
    d.add_argument("--uid", default="00000000-0000-0000-0000-000000000000")
    d.add_argument(
        "--admin-key-file",
        default="",
        metavar="PATH",
        help="also render the pool's Admin token Secret, derived from this key as the "
        "operator would (without it the Secret is left out: the routers wait for it)",
    )
    _add_admin_ca_flags(d, env=False)
    _add_policy_flags(d, env=False)
    args = p.parse_args(argv)
    return {"run": _run, "crds": _crds, "render": _render}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
