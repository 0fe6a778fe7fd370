"""``vertumnus admin``: look at and steer a running pool through its router's Admin API.

    vertumnus admin pool   --target HOST:PORT            the workers, epoch, transitions
    vertumnus admin drain  --target HOST:PORT WORKER     stop admitting, place its queue elsewhere
    vertumnus admin resume --target HOST:PORT WORKER     admit again
    vertumnus admin split  --target HOST:PORT WORKER     one CP2C worker -> two CPC workers
    vertumnus admin merge  --target HOST:PORT A B        two buddy workers -> one
    vertumnus admin scan   --target HOST:PORT            one cache-manager scan now

``--token-file PATH`` (default: ``$VERTUMNUS_ADMIN_TOKEN_FILE``) sends the token a
router started with ``--admin-token-file`` asks for; in Kubernetes it is the pool's
Secret ``<pool>-router-admin`` (key ``token``). ``--tls-ca-file`` dials a router whose
Admin port serves TLS (``--tls-server-name`` the name its certificate carries). ``--json`` prints the answer as JSON
instead of a table. Errors from the
router (an unknown worker, a split the pool refuses) are printed as one line
with the gRPC status, exit code 2; an unreachable router exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vertumnus.channels import add_tls_flags, channel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("admin", help="look at and steer a running pool (its router's Admin API)")
    verbs = p.add_subparsers(dest="admin_cmd", required=True, metavar="VERB")

    def verb(name: str, text: str) -> argparse.ArgumentParser:
        v = verbs.add_parser(name, help=text, description=text)
        v.add_argument("--target", required=True, metavar="HOST:PORT", help="the router's address")
        v.add_argument(
            "--token-file",
            default=os.environ.get("VERTUMNUS_ADMIN_TOKEN_FILE", ""),
            metavar="PATH",
            help="send the admin token on this file's first line (default "
            "$VERTUMNUS_ADMIN_TOKEN_FILE; in Kubernetes the Secret <pool>-router-admin)",
        )
        add_tls_flags(
            v,
            "in Kubernetes the operator's CA, ca.crt of the Secret "
            "<release>-vertumnus-operator-admin-key",
        )
        v.add_argument("--json", action="store_true", help="print the answer as JSON")
        v.add_argument(
            "--timeout", type=float, default=60.0, help="seconds to wait (default %(default)s)"
        )
        v.set_defaults(func=cmd_admin)
        return v

    verb("pool", "the pool's workers, composition, epoch and transitions")
    for name, text in (
        ("drain", "stop admitting at a worker and place its queue elsewhere"),
        ("resume", "admit requests at a drained worker again"),
        ("split", "split a worker into its two halves"),
    ):
        verb(name, text).add_argument("worker", type=int, help="the worker's id")
    m = verb("merge", "merge two buddy workers into one")
    m.add_argument("a", type=int, help="one worker's id")
    m.add_argument("b", type=int, help="its buddy's id")
    verb("scan", "run one cache-manager scan now")


def _call(args: argparse.Namespace) -> Any:

    from vertumnus._proto import pool_pb2, pool_pb2_grpc
    from vertumnus.admintoken import bearer, read_token

    md = bearer(read_token(args.token_file)) if args.token_file else ()
    with channel(args.target, args.tls_ca_file, args.tls_server_name) as ch:
        stub = pool_pb2_grpc.AdminStub(ch)
        kw = {"timeout": args.timeout, "metadata": md}
        cmd = args.admin_cmd
        if cmd == "pool":
            return stub.GetPool(pool_pb2.GetPoolRequest(), **kw)
        if cmd in ("drain", "resume"):
            return stub.Drain(
                pool_pb2.DrainRequest(worker=args.worker, resume=cmd == "resume"), **kw
            )
        if cmd == "split":
            return stub.Reconfigure(
                pool_pb2.ReconfigureRequest(split=args.worker, reason="vertumnus admin"), **kw
            )
        if cmd == "merge":
            pair = pool_pb2.MergePair(a=args.a, b=args.b)
            return stub.Reconfigure(
                pool_pb2.ReconfigureRequest(merge=pair, reason="vertumnus admin"), **kw
            )
        return stub.Scan(pool_pb2.ScanRequest(), **kw)


def cmd_admin(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict

    try:
        reply = _call(args)
    except ValueError as e:  # the token file
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    except grpc.RpcError as e:
        code = e.code()  # type: ignore[attr-defined]
        print(f"vertumnus: error: {code.name}: {e.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1 if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 2
    doc = MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    if args.json:
        print(json.dumps(doc, indent=2))
    elif args.admin_cmd == "pool":
        print(_pool_table(doc))
    else:
        print(", ".join(f"{k}={v}" for k, v in doc.items()))
    return 0


def _pool_table(doc: dict[str, Any]) -> str:
    lines = [
        f"pool {doc['composition']}  epoch {doc['epoch']}  in flight {doc['requests_in_flight']}  "
        f"index {doc['index_blocks']} blocks ({doc['store']}{', degraded' if doc['store_degraded'] else ''})  "
        f"router {doc['router_id']}",
        f"{'worker':>6}  {'degree':>6}  {'ranks':>9}  {'state':<11}  {'q_w s':>8}  {'queued':>6}  {'run':>3}  "
        f"{'blocks':>7}  address",
    ]
    for w in doc["workers"]:
        ranks = f"{w['domain']}:{w['offset']}-{w['offset'] + w['degree'] - 1}"
        lines.append(
            f"{w['worker']:>6}  {'CP' + str(w['degree']):>6}  {ranks:>9}  {w['state'].lower():<11}  "
            f"{w['outstanding_seconds']:8.3f}  {w['queued']:>6}  {w['running']:>3}  {w['cached_blocks']:>7}  {w['address']}"
        )
    for t in doc["transitions"]:
        lines.append(
            f"transition {t['id']}: {t['kind']} {t['removed']} -> {t['added']} ({t['phase']})"
        )
    return "\n".join(lines)
