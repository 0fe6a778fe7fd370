"""``vertumnus up --demo``: a minute of traffic through the local pool, with one split and one merge.

The bundled synthetic workload (conversations and shared prefixes, lengths
scaled to the tiny model) is sent through the router with real gRPC
clients, open loop, for about a minute, with a live progress bar. A third of
the way in, the largest worker is split; two thirds of the way in, its two
halves are merged back — while requests keep arriving. The demo then prints
a TTFT table, the reconfiguration timeline (drain and switch seconds of
each), and draws TTFT over time with the transitions marked.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from vertumnus.core import planner

__all__ = ["run_demo"]

DEMO_TRACE = "synthetic:duration_s=60,mean_rate=6"


async def run_demo(running: Any, stop: asyncio.Event, json_out: str | None) -> int:
    from tqdm import tqdm

    from vertumnus.loadgen import run_load
    from vertumnus.sim.traces import load_trace

    router = running.router
    trace = load_trace(DEMO_TRACE, seed=0)
    requests = list(trace.requests)
    duration = requests[-1].arrival_s - requests[0].arrival_s
    print(
        f"demo: {len(requests)} requests over {duration:.0f} s ({DEMO_TRACE}, lengths x 1/32)",
        flush=True,
    )
    bar = tqdm(total=len(requests), unit="req", desc="demo", file=sys.stderr)
    t_load = router.now()  # router time of the first arrival (records are relative to it)
    load = asyncio.create_task(
        run_load(
            running.address,
            requests,
            trace_block=trace.block_size,
            length_scale=1 / 32,
            vocab_size=router.vocab_size,
            max_tokens=router.max_tokens,
            keep_records=True,
            progress=bar,
            id_prefix="demo",
        )
    )
    steps = asyncio.create_task(_reconfigure(router, duration))
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({load, waiter}, return_when=asyncio.FIRST_COMPLETED)
    bar.close()
    if waiter in done and not load.done():
        load.cancel()
        steps.cancel()
        print("demo: interrupted", flush=True)
        return 0
    waiter.cancel()
    report = load.result()
    transitions = await steps
    _print_table(report.summary(), transitions, t_load)
    picture = Path(json_out).with_suffix(".png") if json_out else Path("vertumnus-demo.png")
    _draw(report.records, transitions, t_load, picture)
    if json_out:
        Path(json_out).write_text(
            json.dumps(
                {
                    "summary": report.summary(),
                    "transitions": transitions,
                    "records": report.records,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"demo: wrote {json_out} and {picture}")
    return 0 if report.failed == 0 else 1


async def _reconfigure(router: Any, duration: float) -> list[dict[str, Any]]:
    """Split the largest worker a third of the way in, merge its halves two thirds in."""
    await asyncio.sleep(duration / 3)
    big = max(router.workers.values(), key=lambda w: (w.address.slot.degree, -w.address.id))
    commit = await router.reconfigure(planner.Split(big.address.id, reason="demo: forced split"))
    await asyncio.sleep(duration / 3)
    a, b = commit.new_ids
    await router.reconfigure(planner.Merge((a, b), reason="demo: forced merge"))
    return list(router.transitions_done)


def _print_table(s: dict[str, Any], transitions: list[dict[str, Any]], t_load: float) -> None:
    print()
    print(
        f"{'requests':>9} {'failed':>7} {'mean TTFT':>10} {'P50':>8} {'P90':>8} {'P99':>8} {'hit rate':>9}"
    )
    print(
        f"{s['completed']:>9} {s['failed']:>7} {s['mean_ttft_s']:>9.3f}s {s['p50_ttft_s']:>7.3f}s "
        f"{s['p90_ttft_s']:>7.3f}s {s['p99_ttft_s']:>7.3f}s {s['token_hit_rate']:>9.3f}"
    )
    print("\nreconfigurations (t: seconds into the run, as in the picture):")
    for t in transitions:
        print(
            f"  t={t['started_s'] - t_load:6.2f}s  {t['kind']:<5} {t['removed']} -> {t['added']}  epoch {t['epoch']}  "
            f"drain {t['drain_s']:.3f}s  switch {t['switch_s']:.3f}s  total {t['total_s']:.3f}s  "
            f"moved {t['moved']}  -> {t['composition']}"
        )


def _draw(
    records: list[dict[str, Any]], transitions: list[dict[str, Any]], t_load: float, path: Path
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("demo: no picture (matplotlib is not installed: pip install 'vertumnus[plot]')")
        return
    ok = [r for r in records if "ttft_s" in r]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.scatter(
        [r["arrival_s"] for r in ok],
        [r["ttft_s"] for r in ok],
        s=6,
        alpha=0.6,
        c=[r["degree"] for r in ok],
        cmap="viridis",
    )
    for t in transitions:
        ax.axvline(t["started_s"] - t_load, color="red" if t["kind"] == "split" else "blue", lw=1)
    ax.set_xlabel("arrival (s)")
    ax.set_ylabel("TTFT (s)")
    ax.set_yscale("log")
    ax.set_title("vertumnus up --demo: TTFT per request (colour: CP degree); red split, blue merge")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
