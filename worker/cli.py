"""Subcommands of ``vertumnus`` that run the torch engine: ``engine verify``,
``profile`` and ``serve``.

:func:`register` adds them to the main parser. torch is imported inside the
handlers only, so ``vertumnus --help`` stays fast and works without the
``worker`` extra. Handlers return an exit code: 0 success, 1 a check failed,
2 bad input (with a message on stderr naming what is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
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
    v.add_argument("--degrees", type=_int_list, default=[1, 2, 4], help="comma-separated CP degrees (powers of two)")
    v.add_argument("--prefix", type=int, default=48, help="shared cached prefix length in tokens (default 48)")
    v.add_argument("--tokens", type=int, default=67, help="uncached tokens of the longest request (default 67)")
    v.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16"])
    v.add_argument("--block-size", type=int, default=8)
    v.add_argument("--model", default=None, help="local HF model directory (default: the seeded tiny model)")
    v.add_argument("--tolerance", type=float, default=None, help="max allowed difference (default by dtype; 1e-9 for float64)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", required=True, help="write the report here ('-' for stdout)")
    v.set_defaults(func=cmd_verify)

    b = engine_sub.add_parser("bench", help="epoch-switch time and block-copy throughput on 4 gloo ranks")
    b.add_argument("--rounds", type=int, default=5, help="CP4 -> 2xCP2 -> CP4 round trips")
    b.add_argument("--copy-tokens", type=int, default=8192, help="prompt length whose blocks are copied")
    b.add_argument("--block-size", type=int, default=16)
    b.add_argument("--json", required=True, help="write the report here ('-' for stdout)")
    b.set_defaults(func=cmd_bench)

    p = subparsers.add_parser(
        "profile",
        help="queue-free prefill timings over a (C, R, P) grid, as a profile CSV for `vertumnus fit`",
    )
    p.add_argument("--degrees", type=_int_list, default=[1, 2])
    p.add_argument("--uncached", type=_int_list, default=[256, 512, 1024, 2048], help="R values")
    p.add_argument("--cached", type=_int_list, default=[0, 1024], help="P values (multiples of the block size)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float64", "float32", "bfloat16"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--model", default=None, help="local HF model directory (default: the seeded tiny model)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="profile CSV to write")
    p.add_argument("--fit-json", default=None, help="also write the fit and its error here (JSON)")
    p.set_defaults(func=cmd_profile)

    s = subparsers.add_parser("serve", help="run a pool of rank processes with one gRPC endpoint per worker")
    s.add_argument("--ranks", type=int, default=2, help="pool size (a power of two)")
    s.add_argument("--degrees", type=_int_list, default=None, help="initial grouping, e.g. 2,1,1 (default: one worker)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--base-port", type=int, default=50051, help="rank r serves on base-port + r")
    s.add_argument("--model", default=None, help="local HF model directory (default: the seeded tiny model)")
    s.add_argument("--dtype", default="float32", choices=["float64", "float32", "bfloat16"])
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--num-blocks", type=int, default=1024, help="KV cache blocks per rank")
    s.add_argument("--max-tokens", type=int, default=8192, help="longest request admitted")
    s.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: rank r on cuda:r, NCCL")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_serve)


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
    from vertumnus.worker.verify import run_verify

    try:
        report = run_verify(
            args.degrees, tokens=args.tokens, prefix=args.prefix, dtype=args.dtype,
            block_size=args.block_size, seed=args.seed, model_path=args.model, tolerance=args.tolerance,
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
    from vertumnus.worker.bench import run_bench

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
    if problem:
        return _fail(problem)
    from vertumnus.worker.profile import fit_error, run_profile, write_profile_csv

    try:
        rows = run_profile(
            args.degrees, args.uncached, args.cached, repeats=args.repeats, dtype=args.dtype,
            block_size=args.block_size, seed=args.seed, model_path=args.model, device=args.device,
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


def cmd_serve(args: argparse.Namespace) -> int:
    degrees = args.degrees or [args.ranks]
    problem = _check_degrees([args.ranks, *degrees]) or _check_model(args.model)
    if not problem and sum(degrees) != args.ranks:
        problem = f"--degrees {degrees} cover {sum(degrees)} ranks, --ranks is {args.ranks}"
    if problem:
        return _fail(problem)
    import signal
    import threading

    from vertumnus.worker.engine import Engine
    from vertumnus.worker.rank import RankSpec
    from vertumnus.worker.service import PoolServer

    spec = RankSpec(model_path=args.model, seed=args.seed, dtype=args.dtype,
                    block_size=args.block_size, num_blocks=args.num_blocks, device=args.device,
                    backend="nccl" if args.device == "cuda" else "gloo")
    try:
        engine = Engine(args.ranks, degrees, spec, max_tokens=args.max_tokens)
    except ValueError as exc:
        return _fail(str(exc))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with engine:
        server = PoolServer(engine, host=args.host, base_port=args.base_port)
        for slot in engine.grouping():
            print(f"worker {slot.first} (CP{slot.degree}) at {args.host}:{server.ports[slot.first]}", file=sys.stderr)
        stop.wait()
        server.stop()
    return 0
