"""Subcommands of ``vertumnus`` that run the torch engine: ``engine verify``,
``profile`` and ``serve`` (and, from :mod:`vertumnus.worker.sglang.cli`, ``worker
--engine sglang``, which prints SGLang workers' commands).

:func:`register` adds them to the main parser. torch is imported inside the
handlers only, so ``vertumnus --help`` stays fast and works without the
``worker`` extra. Handlers return an exit code: 0 success, 1 a check failed,
2 bad input (with a message on stderr naming what is wrong). ``serve`` checks
its arguments and binds its ports before torch loads, and drains its workers
and exits 0 on SIGINT or SIGTERM (docs/worker.md, "Commands").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

from vertumnus.core.lattice import Slot


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def _fail(message: str) -> int:
    print(f"vertumnus: error: {message}", file=sys.stderr)
    return 2


def register(subparsers: argparse._SubParsersAction) -> None:
    engine = subparsers.add_parser("engine", help="the torch CP prefill engine")
    engine_sub = engine.add_subparsers(dest="engine_cmd", required=True)

    v = engine_sub.add_parser(
        "verify",
        help="check zigzag CP against one rank with real process groups",
        description="Run the same batch (odd lengths, with and without a cached prefix) at each "
        "degree on a pool of gloo ranks and report the largest difference from degree 1.",
    )
    v.add_argument(
        "--degrees",
        type=_int_list,
        default=[1, 2, 4],
        help="comma-separated CP degrees (powers of two)",
    )
    v.add_argument(
        "--prefix", type=int, default=48, help="shared cached prefix length in tokens (default 48)"
    )
    v.add_argument(
        "--tokens", type=int, default=67, help="uncached tokens of the longest request (default 67)"
    )
    v.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16"])
    v.add_argument("--block-size", type=int, default=8)
    v.add_argument(
        "--model", default=None, help="local HF model directory (default: the seeded tiny model)"
    )
    v.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="max allowed difference (default by dtype; 1e-9 for float64)",
    )
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", required=True, help="write the report here ('-' for stdout)")
    v.set_defaults(func=cmd_verify)

    b = engine_sub.add_parser(
        "bench", help="epoch-switch time and block-copy throughput on 4 gloo ranks"
    )
    b.add_argument("--rounds", type=int, default=5, help="CP4 -> 2xCP2 -> CP4 round trips")
    b.add_argument(
        "--copy-tokens", type=int, default=8192, help="prompt length whose blocks are copied"
    )
    b.add_argument("--block-size", type=int, default=16)
    b.add_argument("--json", required=True, help="write the report here ('-' for stdout)")
    b.set_defaults(func=cmd_bench)

    p = subparsers.add_parser(
        "profile",
        help="queue-free prefill timings over a (C, R, P) grid, as a profile CSV for `vertumnus fit`",
    )
    p.add_argument("--degrees", type=_int_list, default=[1, 2])
    p.add_argument("--uncached", type=_int_list, default=[256, 512, 1024, 2048], help="R values")
    p.add_argument(
        "--cached", type=_int_list, default=[0, 1024], help="P values (multiples of the block size)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed runs of each grid point before its repeats"
    )
    p.add_argument("--dtype", default="float32", choices=["float64", "float32", "bfloat16"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--model", default=None, help="local HF model directory (default: the seeded tiny model)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="profile CSV to write")
    p.add_argument("--fit-json", default=None, help="also write the fit and its error here (JSON)")
    p.set_defaults(func=cmd_profile)

    s = subparsers.add_parser(
        "serve",
        help="run a pool of rank processes with one gRPC endpoint per rank",
        description="Start RANKS rank processes (the GPUs of one NVLink domain), group them into CP "
        "workers and serve them over gRPC (service vertumnus.worker.v1.Worker): rank r listens on "
        "BASE_PORT + r, and a worker is served by the endpoint of its first rank. Epoch RPCs regroup "
        "the ranks later. Ctrl-C or SIGTERM stops the server: workers are drained first.",
    )
    s.add_argument(
        "--ranks",
        type=int,
        default=2,
        help="number of rank processes, one per GPU; a power of two (default %(default)s)",
    )
    s.add_argument(
        "--degrees",
        type=_int_list,
        default=None,
        help="CP degrees of the first workers, left to right over the ranks, e.g. 2,1,1; each a "
        "power of two starting at a multiple of itself (default: one worker of all ranks)",
    )
    s.add_argument(
        "--worker-ids",
        type=_int_list,
        default=None,
        help="pool-level ids of those workers, in the same order (default: each worker's first rank)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default %(default)s; 0.0.0.0 for every interface)",
    )
    s.add_argument(
        "--base-port",
        type=int,
        default=50051,
        help="rank r listens on BASE_PORT + r; all of them must be in 1..65535 (default %(default)s)",
    )
    s.add_argument(
        "--model", default=None, help="local HF model directory (default: the seeded tiny model)"
    )
    s.add_argument(
        "--dtype",
        default="float32",
        choices=["float64", "float32", "bfloat16"],
        help="weights and KV cache dtype (default %(default)s)",
    )
    s.add_argument(
        "--block-size", type=int, default=16, help="tokens per KV cache block (default %(default)s)"
    )
    s.add_argument(
        "--num-blocks",
        type=int,
        default=1024,
        help="KV cache blocks per rank (default %(default)s)",
    )
    s.add_argument(
        "--max-tokens",
        type=int,
        default=8192,
        help="longest request admitted (default %(default)s)",
    )
    s.add_argument(
        "--event-buffer",
        type=int,
        default=4096,
        help="cache events kept per worker for subscribers that reconnect (default %(default)s)",
    )
    s.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cpu: gloo; cuda: rank r on cuda:r, NCCL (default %(default)s)",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the tiny model's random weights (default %(default)s; unused with --model)",
    )
    s.add_argument(
        "--exit-with",
        type=int,
        default=None,
        metavar="PID",
        help="stop (draining first) when process PID ends; `vertumnus up` passes its own",
    )
    s.set_defaults(func=cmd_serve)

    # `vertumnus worker --engine sglang ...`: SGLang servers (imports nothing heavy).
    from .sglang import cli as sglang_cli

    sglang_cli.register(subparsers)


def _check_degrees(degrees: list[int]) -> str | None:
    bad = [d for d in degrees if d < 1 or d & (d - 1)]
    return f"degrees must be powers of two, got {bad}" if bad else None


def _check_model(path: str | None) -> str | None:
    if path and not (Path(path) / "config.json").is_file():
        return f"--model {path}: not a directory with config.json"
    return None


def cmd_verify(args: argparse.Namespace) -> int:
    problem = _check_degrees(args.degrees) or _check_model(args.model)
    if args.tokens < 1 or args.prefix < 0 or args.block_size < 1:
        problem = problem or "--tokens and --block-size must be >= 1 and --prefix >= 0"
    if problem:
        return _fail(problem)
    from .verify import run_verify

    try:
        report = run_verify(
            args.degrees,
            tokens=args.tokens,
            prefix=args.prefix,
            dtype=args.dtype,
            block_size=args.block_size,
            seed=args.seed,
            model_path=args.model,
            tolerance=args.tolerance,
        )
    except ValueError as exc:
        return _fail(str(exc))
    text = json.dumps(report, indent=2)
    if args.json == "-":
        print(text)
    else:
        Path(args.json).write_text(text + "\n")
    for degree, e in report["degrees"].items():
        print(
            f"C={degree}: max_abs_diff={e['max_abs_diff']:.3g} prefix_max_abs_diff={e['prefix_max_abs_diff']:.3g} "
            f"cached={e['cached_tokens']} {'ok' if e['passed'] else 'FAIL'}",
            file=sys.stderr,
        )
    return 0 if report["passed"] else 1


def cmd_bench(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.copy_tokens < args.block_size or args.block_size < 1:
        return _fail("--rounds must be >= 1 and --copy-tokens at least one block")
    from .bench import run_bench

    report = run_bench(rounds=args.rounds, copy_tokens=args.copy_tokens, block_size=args.block_size)
    text = json.dumps(report, indent=2)
    if args.json == "-":
        print(text)
    else:
        Path(args.json).write_text(text + "\n")
    ok = report["switch"]["same_first_tokens"] and report["switch"]["prefixes_reused_after_merge"]
    ok = ok and all(c["byte_exact"] for k, c in report["copy"].items() if k != "block_bytes")
    return 0 if ok else 1


def cmd_profile(args: argparse.Namespace) -> int:
    problem = _check_degrees(args.degrees) or _check_model(args.model)
    if not problem and (0 in args.uncached or args.repeats < 1):
        problem = "--uncached values and --repeats must be >= 1"
    if not problem and args.warmup < 0:
        problem = "--warmup must be >= 0"
    if problem:
        return _fail(problem)
    from .profile import fit_error, run_profile, write_profile_csv

    try:
        rows = run_profile(
            args.degrees,
            args.uncached,
            args.cached,
            repeats=args.repeats,
            warmup=args.warmup,
            dtype=args.dtype,
            block_size=args.block_size,
            seed=args.seed,
            model_path=args.model,
            device=args.device,
        )
    except ValueError as exc:
        return _fail(str(exc))
    write_profile_csv(rows, args.out)
    print(f"wrote {len(rows)} measurements to {args.out}", file=sys.stderr)
    fit = fit_error(args.out)
    if fit is not None:
        print(f"fit MAPE: {fit['mape']:.2%} by degree {fit['mape_by_degree']}", file=sys.stderr)
        if args.fit_json:
            Path(args.fit_json).write_text(json.dumps(fit, indent=2) + "\n")
    return 0


MAX_PORT = 65535


def _serve_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``serve``'s arguments, checked before anything starts."""
    n = args.ranks
    if n < 1 or n & (n - 1):
        return f"--ranks {n}: the rank count must be a power of two (1, 2, 4, 8, ...)"
    degrees = args.degrees or [n]
    problem = _check_degrees(degrees) or _check_model(args.model)
    if problem:
        return problem
    if sum(degrees) != n:
        return f"--degrees {degrees} cover {sum(degrees)} ranks, --ranks is {n}"
    if args.worker_ids is not None and len(args.worker_ids) != len(degrees):
        return (
            f"--worker-ids {args.worker_ids}: {len(args.worker_ids)} ids for {len(degrees)} workers"
        )
    if not 1 <= args.base_port <= MAX_PORT - n + 1:
        return (
            f"--base-port {args.base_port}: ranks 0..{n - 1} listen on ports {args.base_port}.."
            f"{args.base_port + n - 1}, and a port is 1..{MAX_PORT}"
        )
    if args.block_size < 1 or args.num_blocks < 1 or args.max_tokens < 1 or args.event_buffer < 1:
        return "--block-size, --num-blocks, --max-tokens and --event-buffer must be >= 1"
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    problem = _serve_problem(args)
    if problem:
        return _fail(problem)
    from .lattice import default_grouping, engine_grouping

    try:
        slots = default_grouping(args.degrees or [args.ranks], args.ranks)
        if args.worker_ids is not None:
            slots = [
                Slot(i, s.degree, s.domain, s.offset)
                for i, s in zip(args.worker_ids, slots, strict=True)
            ]
            engine_grouping(slots, args.ranks)
    except ValueError as exc:
        return _fail(str(exc))

    import signal

    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():  # a second signal: the user does not want to wait for the drain
            print("vertumnus: stopping now, without draining", file=sys.stderr)
            os._exit(130)
        stop.set()

    for sig in previous:
        signal.signal(sig, on_signal)
    if args.exit_with is not None:
        from .lifetime import on_exit_of

        on_exit_of(args.exit_with, stop.set)
    try:
        return _serve(args, slots, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(args: argparse.Namespace, slots: list[Slot], stop: threading.Event) -> int:
    """``serve`` once its arguments are checked and the signals only set ``stop``."""
    from .errors import NotReady
    from .pool import start_forkserver
    from .rank import RankSpec
    from .service import PoolServer  # grpc only: a taken port fails before torch loads

    try:
        server = PoolServer(args.ranks, host=args.host, base_port=args.base_port)
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    start_forkserver()  # the ranks' torch import overlaps ours
    from .engine import Engine

    spec = RankSpec(
        model_path=args.model,
        seed=args.seed,
        dtype=args.dtype,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        device=args.device,
        backend="nccl" if args.device == "cuda" else "gloo",
    )
    try:
        engine = Engine(
            args.ranks, slots, spec, max_tokens=args.max_tokens, event_buffer=args.event_buffer
        )
    except ValueError as exc:
        server.stop(0)
        return _fail(str(exc))
    except Exception as exc:  # a rank failed to start (model, memory, devices)
        server.stop(0)
        print(
            f"vertumnus: error: the engine did not start: {str(exc).splitlines()[0]}",
            file=sys.stderr,
        )
        return 1
    with engine:
        if not stop.is_set():
            from vertumnus.gcfreeze import freeze_startup

            # torch's objects, out of every full collection's walk; before the first
            # request, so that the freeze's own collection delays none.
            freeze_startup()
            server.start(engine)
            for w in (engine.worker(s.worker) for s in engine.grouping()):
                print(f"{w.describe()} at {server.endpoint(w.slot.offset)}", file=sys.stderr)
            print(
                f"serving {args.ranks} ranks, epoch {engine.epoch}; Ctrl-C or SIGTERM stops "
                "(workers are drained first)",
                file=sys.stderr,
            )
            while not stop.wait(1.0):
                pass
        print("vertumnus: stopping: draining workers", file=sys.stderr)
        for s in engine.grouping():
            try:
                engine.drain(s.worker)
            except NotReady as exc:  # a drain that timed out: stop anyway
                print(f"vertumnus: {exc}", file=sys.stderr)
        server.refresh_health()
        server.stop(5.0)
    print("vertumnus: stopped", file=sys.stderr)
    return 0
