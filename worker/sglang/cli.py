"""``vertumnus worker --engine sglang``: the SGLang servers of a worker or a domain pod.

::

    vertumnus worker --engine sglang --degree 4 --model /models/qwen3 --print-command
    vertumnus worker --engine sglang --degrees 4,2,2 --model /models/qwen3 --print-command --json

``--degree C [--offset O | --gpus 4,5,6,7]`` is one worker; ``--degrees`` a whole
pod's grouping, left to right over its GPUs. ``--print-command`` prints, for each
server, the environment and the exact ``python3 -m sglang.launch_server`` command
line (:mod:`vertumnus.worker.sglang.command`) and starts nothing; ``--json`` prints
the same as JSON (argv, env, ports). Without ``--print-command`` it runs the adapter
(:mod:`vertumnus.worker.sglang.serve`): it starts and supervises one server per worker
of the grouping (``--degrees``, or ``--degree C`` alone for a one-worker pod) and
serves our ``Worker`` gRPC protocol over them, rank r on ``--grpc-base-port + r``.
``--launcher`` runs another program with the same SGLang flags (a stand-in server).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from vertumnus.core.lattice import Slot

from .command import (
    DTYPES,
    TRANSFER_BACKENDS,
    CommandError,
    PortPlan,
    ServerCommand,
    SglangOptions,
    pod_commands,
    server_command,
)

__all__ = ["cmd_worker", "register"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    ports = PortPlan()
    w = subparsers.add_parser(
        "worker",
        help="engine workers other than the torch engine's (SGLang): run or print their servers",
        description="The SGLang servers of one CP worker (--degree) or of a domain pod's grouping "
        "(--degrees), run by the adapter behind the Worker gRPC protocol. A server of the worker whose first GPU in the pod is O listens on "
        "HTTP_BASE_PORT + O (and so on for each port kind). --print-command prints the environment "
        "and the exact SGLang command line of each server without starting anything.",
    )
    w.add_argument("--engine", required=True, choices=["sglang"], help="the engine (sglang)")
    shape = w.add_mutually_exclusive_group(required=True)
    shape.add_argument("--degree", type=int, help="CP degree of one worker (a power of two)")
    shape.add_argument("--degrees", type=_ints, help="a pod's workers, e.g. 4,2,2")
    w.add_argument(
        "--offset", type=int, default=0, help="with --degree: its first GPU in the pod (default 0)"
    )
    w.add_argument(
        "--gpus", type=_ints, default=None, help="with --degree: its pod-local GPUs, e.g. 4,5,6,7"
    )
    w.add_argument(
        "--gpus-per-domain", type=int, default=None, help="with --degrees: GPUs the pod has"
    )
    w.add_argument("--model", required=True, help="model directory the servers load")
    w.add_argument("--block-size", type=int, default=16, help="= SGLang's --page-size (16)")
    w.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="(default bfloat16)")
    w.add_argument(
        "--transfer-backend", default="mooncake", choices=TRANSFER_BACKENDS, help="(mooncake)"
    )
    w.add_argument(
        "--host", default="127.0.0.1", help="HTTP and bootstrap address (0.0.0.0 in a pod)"
    )
    w.add_argument("--http-base-port", type=int, default=ports.http)
    w.add_argument("--bootstrap-base-port", type=int, default=ports.bootstrap)
    w.add_argument("--events-base-port", type=int, default=ports.events)
    w.add_argument("--replay-base-port", type=int, default=ports.replay)
    w.add_argument("--nccl-base-port", type=int, default=ports.nccl)
    w.add_argument(
        "--grpc-base-port",
        type=int,
        default=50051,
        help="the adapter's Worker endpoints (rank r on BASE + r, as `vertumnus serve`)",
    )
    w.add_argument(
        "--max-tokens",
        type=int,
        default=131072,
        help="the adapter's longest admitted request (as `vertumnus serve`)",
    )
    w.add_argument("--attention-backend", default="fa3", help="(fa3; 'auto' leaves it to SGLang)")
    w.add_argument("--mem-fraction-static", type=float, default=None)
    w.add_argument("--served-model-name", default=None)
    w.add_argument("--trust-remote-code", action="store_true")
    w.add_argument("--python", default="python3", help="the interpreter (default python3)")
    w.add_argument(
        "--worker-ids",
        type=_ints,
        default=None,
        help="pool-level ids of the --degrees workers, in order (default: each one's first GPU)",
    )
    w.add_argument(
        "--launcher",
        default=None,
        help="run this command line instead of `PYTHON -m sglang.launch_server`, with the same "
        "flags (tests: a stand-in server)",
    )
    w.add_argument(
        "--vocab-size", type=int, default=None, help="(default: the model's config.json)"
    )
    w.add_argument(
        "--health-timeout",
        type=float,
        default=900.0,
        help="seconds for a server to answer /health after it starts (default 900)",
    )
    w.add_argument(
        "--stop-timeout",
        type=float,
        default=30.0,
        help="seconds from SIGTERM to SIGKILL when a server stops (default 30)",
    )
    w.add_argument(
        "--event-buffer",
        type=int,
        default=4096,
        help="cache events kept per worker for subscribers that reconnect (default 4096)",
    )
    w.add_argument("--print-command", action="store_true", help="print the commands, start nothing")
    w.add_argument("--json", action="store_true", help="with --print-command: print JSON")
    w.set_defaults(func=cmd_worker)


def _options(args: argparse.Namespace) -> SglangOptions:
    return SglangOptions(
        model_path=args.model,
        block_size=args.block_size,
        dtype=args.dtype,
        transfer_backend=args.transfer_backend,
        host=args.host,
        ports=PortPlan(
            http=args.http_base_port,
            bootstrap=args.bootstrap_base_port,
            events=args.events_base_port,
            replay=args.replay_base_port,
            nccl=args.nccl_base_port,
        ),
        attention_backend=None
        if args.attention_backend in ("", "auto")
        else args.attention_backend,
        mem_fraction_static=args.mem_fraction_static,
        served_model_name=args.served_model_name,
        trust_remote_code=args.trust_remote_code,
        python=args.python,
    )


def _servers(args: argparse.Namespace) -> list[ServerCommand]:
    options = _options(args)
    if args.degree is not None:
        if args.gpus_per_domain is not None:
            raise CommandError("--gpus-per-domain goes with --degrees")
        return [server_command(args.degree, options, offset=args.offset, gpus=args.gpus)]
    if args.gpus is not None or args.offset:
        raise CommandError("--gpus and --offset go with --degree (--degrees lays workers out)")
    return pod_commands(args.degrees, options, args.gpus_per_domain)


def _describe(s: ServerCommand) -> str:
    gpus = ",".join(map(str, s.gpus))
    return (
        f"# CP{s.degree} worker at GPU offset {s.offset} (GPUs {gpus}): HTTP port {s.ports['http']}, "
        f"bootstrap port {s.ports['bootstrap']}, KV events {s.events_endpoint} "
        f"(replay {s.replay_endpoint})"
    )


def cmd_worker(args: argparse.Namespace) -> int:
    try:
        servers = _servers(args)
    except CommandError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    if not args.print_command:
        return _run(args, servers)
    if args.json:
        doc = {
            "engine": "sglang",
            "grpcBasePort": args.grpc_base_port,
            "maxTokens": args.max_tokens,
            "servers": [s.to_json() for s in servers],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for s in servers:
        print(_describe(s))
        print(s.shell())
    return 0


def _run(args: argparse.Namespace, servers: list[ServerCommand]) -> int:
    """Run the adapter over the grouping ``servers`` describes (its commands are checked)."""
    from .adapter import AdapterSettings
    from .serve import run_adapter

    if args.gpus is not None or args.offset:
        print(
            "vertumnus: error: the adapter runs a whole pod's grouping: use --degrees (or "
            "--degree C alone), not --gpus/--offset",
            file=sys.stderr,
        )
        return 2
    world = args.gpus_per_domain or sum(s.degree for s in servers)
    ids = args.worker_ids or [s.offset for s in servers]
    if len(ids) != len(servers):
        print(
            f"vertumnus: error: --worker-ids {ids}: {len(ids)} ids for {len(servers)} workers",
            file=sys.stderr,
        )
        return 2
    slots = [Slot(i, s.degree, 0, s.offset) for i, s in zip(ids, servers, strict=True)]
    settings = AdapterSettings(
        max_tokens=args.max_tokens,
        event_buffer=args.event_buffer,
        health_timeout_s=args.health_timeout,
        stop_timeout_s=args.stop_timeout,
        launcher=tuple(shlex.split(args.launcher)) if args.launcher else None,
        vocab_size=args.vocab_size,
    )
    return run_adapter(
        world,
        slots,
        _options(args),
        settings,
        host=args.host,
        grpc_base_port=args.grpc_base_port,
    )
