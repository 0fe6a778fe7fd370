"""GPU check of the SGLang adapter on one GPU (issue 13, item 6). Not run yet.

What it does, on one H200 with a small model from a local directory (e.g. Qwen3-0.6B),
in under 8 minutes, through the adapter itself (:class:`vertumnus.worker.sglang.adapter.SglangEngine`,
the same code the pod runs):

1. starts one SGLang 0.5.23 server at C=1 with the exact command of
   ``vertumnus.worker.sglang.command`` (``--transfer-backend fake`` by default: no decode
   server and no RDMA here) and times start → healthy;
2. prefills random prompts without a prefix hit (``cached_tokens`` must be 0) and with
   one (the prefix, a multiple of the page size, prefilled just before: ``cached_tokens``
   must be exactly that prefix) — this also checks that a request with SGLang's fake
   decode peer (``bootstrap_host`` 2.2.2.2) is cached, which CPU tests cannot;
3. checks the server's KV events reached our index: after each prefill the worker's
   ``ListBlocks`` must serve the prompt's full-page keys as ``token_block_keys`` makes
   them (the router's keys), with no lost batch;
4. restarts the server as a regroup does (an epoch that replaces the worker) and times
   stop → healthy;
5. writes the timings as the profile CSV ``vertumnus fit`` reads
   (``degree,uncached_tokens,cached_tokens,seconds``, ``worker/profile.py``; seconds =
   SGLang's ``e2e_latency`` of a request sent alone) and everything to ``--out`` (JSON,
   rewritten after each phase so a run cut short still reports).

Needs ``pip install -e '.[worker,sglang]'`` (SGLang, pyzmq, msgpack) and a CUDA GPU; it
checks both first and exits 2 at once, naming what is missing (the JSON says so too).

    python bench/gpu/sglang_check.py --model /models/Qwen3-0.6B --out results/sglang-h200.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

PAGE = 16  # our block size = SGLang's --page-size


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="local model directory (with config.json)")
    ap.add_argument("--out", required=True, type=Path, help="results JSON")
    ap.add_argument("--profile-csv", type=Path, default=None, help="(default: OUT with .csv)")
    ap.add_argument("--uncached", type=_ints, default=[1024, 4096, 16384], help="R values")
    ap.add_argument("--cached", type=_ints, default=[0, 4096], help="P values (multiples of 16)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop measuring after this")
    ap.add_argument("--health-timeout", type=float, default=240.0)
    ap.add_argument("--transfer-backend", default="fake")
    ap.add_argument("--mem-fraction-static", type=float, default=0.8)
    ap.add_argument(
        "--sglang-arg",
        action="append",
        default=None,
        help="extra server flag, verbatim (repeatable; default --disable-cuda-graph: a "
        "prefill runs no CUDA graph, and the server starts sooner without capturing them)",
    )
    ap.add_argument("--base-port", type=int, default=40000, help="the server's port bases")
    ap.add_argument("--no-restart", action="store_true", help="skip the restart timing")
    ap.add_argument(
        "--launcher",
        default=None,
        help="run this instead of `python3 -m sglang.launch_server` and skip the SGLang and "
        "CUDA checks (a CPU smoke test of this script with tests/worker/sglang_standin.py)",
    )
    args = ap.parse_args(argv)
    bad = [p for p in args.cached if p % PAGE]
    if bad:
        ap.error(f"--cached {bad}: prefixes are whole pages, multiples of {PAGE}")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.sglang_arg is None:
        args.sglang_arg = ["--disable-cuda-graph"]
    if args.profile_csv is None:
        args.profile_csv = args.out.with_suffix(".csv")
    return args


def preflight(model: str, standin: bool = False) -> list[str]:
    """What is missing to run the check (empty: nothing); with a stand-in server, only
    what the adapter itself needs."""
    problems = []
    needed = (
        ("sglang", "SGLang 0.5.23 is not installed: pip install -e '.[worker,sglang]'"),
        ("zmq", "pyzmq is not installed (the sglang extra)"),
        ("msgpack", "msgpack is not installed (the sglang extra)"),
        (
            "vertumnus.worker.sglang",
            "vertumnus is not installed: pip install -e '.[worker,sglang]'",
        ),
    )
    for module, why in needed[1:] if standin else needed:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            problems.append(why)
    try:
        import torch

        if not standin and not torch.cuda.is_available():
            problems.append("no CUDA GPU (torch.cuda.is_available() is False)")
    except ImportError:
        problems.append("torch is not installed (SGLang needs it)")
    if not (Path(model) / "config.json").is_file():
        problems.append(f"{model}: no config.json (a local Hugging Face model directory)")
    return problems


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def run(args: argparse.Namespace, doc: dict[str, Any]) -> bool:
    from vertumnus.core.keys import token_block_keys
    from vertumnus.core.lattice import Slot
    from vertumnus.worker.profile import write_profile_csv
    from vertumnus.worker.sglang.adapter import AdapterSettings, SglangEngine
    from vertumnus.worker.sglang.command import SGLANG_VERSION, PortPlan, SglangOptions

    b = args.base_port
    options = SglangOptions(
        model_path=args.model,
        block_size=PAGE,
        transfer_backend=args.transfer_backend,
        ports=PortPlan(http=b, bootstrap=b + 100, events=b + 200, replay=b + 300, nccl=b + 400),
        mem_fraction_static=args.mem_fraction_static,
        extra_args=tuple(args.sglang_arg),
    )
    longest = max(args.uncached) + max(args.cached)
    settings = AdapterSettings(
        max_tokens=longest + 1,
        health_timeout_s=args.health_timeout,
        launcher=tuple(shlex.split(args.launcher)) if args.launcher else None,
    )
    doc["sglang_version"] = SGLANG_VERSION
    t0 = time.monotonic()
    engine = SglangEngine(1, [1], options, settings)
    doc["start_to_healthy_s"] = time.monotonic() - t0
    _write(args.out, doc)
    rng = random.Random(0)
    rows: list[tuple[int, int, int, float]] = []
    checks: list[dict[str, Any]] = []
    worker = 0
    prompt: list[int] = []
    try:
        vocab = engine.vocab_size
        engine.prefill(worker, "warmup", [rng.randrange(vocab) for _ in range(min(args.uncached))])
        for p in args.cached:
            for r in args.uncached:
                for i in range(args.repeats):
                    if time.monotonic() - t0 > args.budget_s:
                        doc["stopped_early"] = "budget"
                        break
                    prompt = [rng.randrange(vocab) for _ in range(p + r)]
                    if p:
                        engine.prefill(worker, f"prefix-{p}-{r}-{i}", prompt[:p])
                    out = engine.prefill(worker, f"measure-{p}-{r}-{i}", prompt)
                    rows.append(
                        (
                            1,
                            len(prompt) - out.cached_tokens,
                            out.cached_tokens,
                            out.execution_seconds,
                        )
                    )
                    keys = list(token_block_keys(prompt, PAGE))
                    deadline = time.monotonic() + 5
                    while True:  # the events of this prefill reach the worker's index
                        served = {blk.key for blk in engine.list_blocks(worker).served}
                        if set(keys) <= served or time.monotonic() > deadline:
                            break
                        time.sleep(0.02)
                    checks.append(
                        {
                            "cached": p,
                            "uncached": r,
                            "cached_tokens": out.cached_tokens,
                            "cache_hit_ok": out.cached_tokens == p,
                            "keys": len(keys),
                            "keys_indexed": len(set(keys) & served),
                            "events_ok": set(keys) <= served,
                            "seconds": out.execution_seconds,
                            "round_trip_queue_s": out.queue_seconds,
                        }
                    )
                    print(
                        f"C=1 R={r} P={p}: {out.execution_seconds * 1e3:.1f} ms, cached "
                        f"{out.cached_tokens}, keys indexed {len(set(keys) & served)}/{len(keys)}",
                        file=sys.stderr,
                    )
            doc["prefills"] = checks
            _write(args.out, doc)
        # The same prompt again: every full page but the one holding the last token is a hit.
        again = engine.prefill(worker, "repeat", prompt)
        doc["repeat"] = {
            "tokens": len(prompt),
            "cached_tokens": again.cached_tokens,
            "ok": again.cached_tokens == (len(prompt) - 1) // PAGE * PAGE,
        }
        w = engine.worker(worker)
        doc["events"] = {
            "last_sequence": w.events.last_sequence,
            "lost_gaps_recovered": w.pump.recoveries,
            "unkeyable_blocks": w.pump.decoder.unkeyable_blocks,
            "duplicates": w.pump.decoder.duplicates,
        }
        write_profile_csv(rows, args.profile_csv)
        doc["profile_csv"] = str(args.profile_csv)
        if not args.no_restart and time.monotonic() - t0 < args.budget_s:
            engine.drain(worker)
            report = engine.switch_epoch(2, [Slot(1, 1, 0, 0)])  # a new worker: a restart
            doc["restart_s"] = report.seconds
            doc["restart"] = vars(engine.restarts[-1])
        ok = bool(checks) and all(c["cache_hit_ok"] and c["events_ok"] for c in checks)
        doc["ok"] = ok and doc["repeat"]["ok"] and w.pump.recoveries == 0
        return bool(doc["ok"])
    finally:
        engine.close()
        doc["total_s"] = time.monotonic() - t0
        _write(args.out, doc)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc: dict[str, Any] = {"check": "sglang adapter on one GPU", "model": args.model, "ok": False}
    problems = preflight(args.model, standin=args.launcher is not None)
    if problems:
        for p in problems:
            print(f"sglang_check: error: {p}", file=sys.stderr)
        doc["problems"] = problems
        _write(args.out, doc)
        return 2
    try:
        return 0 if run(args, doc) else 1
    except Exception as exc:  # report it in the JSON too: the device run returns only files
        doc["error"] = f"{type(exc).__name__}: {exc}"
        _write(args.out, doc)
        raise


if __name__ == "__main__":
    sys.exit(main())
