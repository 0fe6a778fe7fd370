"""The router's TakeWindow report: a message per placement against packed columns, side by side.

    python bench/window_report.py [--rows 1900] [--keys 20] [--runs 21] [--json OUT]

The router builds the report of a hop's first placements on its event loop at every
take (every 2.5 s per pool), ahead of the placements waiting there; the operator reads
it back into rows. ``--rows`` is a hop's placements (1,900: a 1,024-GPU pool at 0.75
requests/s per GPU over 2.5 s), ``--keys`` the block keys per request. Both forms are
built, serialized, parsed and read back in alternating order; the rows are checked
equal. Reported: median milliseconds of build + serialize (the router's part) and of
parse + read (the operator's), and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from vertumnus._proto import pool_pb2
    from vertumnus.operator.routerapi import placed_rows
    from vertumnus.router.service import _columns

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1900)
    p.add_argument("--keys", type=int, default=20)
    p.add_argument("--runs", type=int, default=21)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.rows < 1 or args.keys < 0 or args.runs < 2:
        p.error("--rows >= 1, --keys >= 0, --runs >= 2")
    rng = random.Random(0)
    listed = [
        (
            rng.random() * 2.5,
            16 * args.keys,
            8 * args.keys,
            tuple(rng.getrandbits(64) for _ in range(args.keys)),
            rng.randrange(64),  # the worker (since 2026-12-07)
        )
        for _ in range(args.rows)
    ]
    # A message per placement names no worker: the operator reads -1 there.
    unnamed = [(*row[:4], -1) for row in listed]

    def messages() -> pool_pb2.WindowReport:  # the router's report before 2026-12-06
        return pool_pb2.WindowReport(
            placed=[
                pool_pb2.PlacedRequest(offset_seconds=o, length=n, cached_tokens=c, block_keys=k)
                for o, n, c, k, _ in listed
            ]
        )

    def columns() -> pool_pb2.WindowReport:
        return pool_pb2.WindowReport(placed_columns=_columns(listed))

    times: dict[str, list[float]] = {}
    for run in range(args.runs):
        forms = [("messages", messages), ("columns", columns)]
        for name, build in forms if run % 2 else reversed(forms):
            t = time.perf_counter()
            wire = build().SerializeToString()
            built = time.perf_counter() - t
            t = time.perf_counter()
            rows = placed_rows(pool_pb2.WindowReport.FromString(wire))
            read = time.perf_counter() - t
            assert rows == (listed if name == "columns" else unnamed), name
            times.setdefault(f"{name}_router_ms", []).append(built)
            times.setdefault(f"{name}_operator_ms", []).append(read)
            times.setdefault(f"{name}_bytes", []).append(len(wire))
    out: dict[str, object] = {
        "command": "python bench/window_report.py " + " ".join(argv or sys.argv[1:]),
        "rows": args.rows,
        "keys_per_row": args.keys,
        **{
            k: (round(1e3 * statistics.median(v), 3) if k.endswith("_ms") else v[0])
            for k, v in times.items()
        },
    }
    for part in ("router", "operator"):
        out[f"{part}_columns_over_messages"] = round(
            out[f"columns_{part}_ms"] / out[f"messages_{part}_ms"],
            2,  # type: ignore[operator]
        )
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
