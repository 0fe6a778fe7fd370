"""``vertumnus profile``: queue-free prefill timings over a grid of (C, R, P).

For every degree C the pool is regrouped into CP-C workers and worker 0
prefills, one request at a time (so nothing ever queues), a fresh random
prompt of P + R tokens whose first P tokens were prefilled just before: the
measured step then reuses exactly P cached tokens and computes R. The time
recorded is the engine step as measured on the worker's first rank. Each grid
point first runs ``warmup`` times untimed: a shape's first step pays for
allocations and (on CUDA) kernel selection, which on an H200 made a first
4096-token step take 2.4x its second.

Output is the profile CSV that ``vertumnus fit`` reads: header
``degree,uncached_tokens,cached_tokens,seconds``, one row per measurement.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

import torch

PROFILE_HEADER = ("degree", "uncached_tokens", "cached_tokens", "seconds")


def run_profile(
    degrees: Sequence[int],
    uncached: Sequence[int],
    cached: Sequence[int],
    *,
    repeats: int = 3,
    warmup: int = 1,
    dtype: str = "float32",
    block_size: int = 16,
    seed: int = 0,
    model_path: str | None = None,
    device: str = "cpu",
    log: TextIO | None = None,
) -> list[tuple[int, int, int, float]]:
    from .engine import Engine
    from .rank import RankSpec

    bad = [p for p in cached if p % block_size]
    if bad:
        raise ValueError(f"cached lengths {bad} are not multiples of the block size {block_size}")
    degrees = sorted(set(degrees))
    world = max(degrees)
    longest = max(uncached) + max(cached)
    spec = RankSpec(
        model_path=model_path,
        seed=seed,
        dtype=dtype,
        block_size=block_size,
        num_blocks=2 * (longest // block_size + 2),
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
    )
    log = log or sys.stderr
    gen = torch.Generator().manual_seed(seed)
    rows = []
    with Engine(world, [degrees[0]] * (world // degrees[0]), spec, max_tokens=longest) as engine:
        vocab = engine.vocab_size
        for epoch, degree in enumerate(degrees, start=1):
            if epoch > 1:
                for w in list(engine.workers):
                    engine.drain(w)
                engine.switch_epoch(epoch, [degree] * (world // degree))
            for p in cached:
                for r in uncached:
                    for i in range(warmup + repeats):
                        prompt = torch.randint(0, vocab, (p + r,), generator=gen).tolist()
                        if p:
                            engine.prefill(0, "prefix", prompt[:p])
                        out = engine.prefill(0, "measure", prompt)
                        if i < warmup:
                            continue
                        rows.append(
                            (
                                degree,
                                len(prompt) - out.cached_tokens,
                                out.cached_tokens,
                                out.execution_seconds,
                            )
                        )
                    print(f"C={degree} R={r} P={p}: {rows[-1][3] * 1e3:.2f} ms", file=log)
    return rows


def write_profile_csv(rows: Iterable[tuple[int, int, int, float]], path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROFILE_HEADER)
        for degree, r, p, seconds in rows:
            w.writerow([degree, r, p, f"{seconds:.9f}"])


def fit_error(path: str | Path) -> dict | None:
    """Fit the profile with the policy core's fit, if it is available; MAPE per degree."""
    try:
        from vertumnus.core.fit import fit_profile
        from vertumnus.profiles import read_profile_csv
    except ImportError:
        return None
    result = fit_profile(read_profile_csv(path), name=Path(path).stem)
    m = result.model
    return {
        "mape": result.mape,
        "mape_by_degree": {str(k): v for k, v in sorted(result.mape_by_degree.items())},
        "model": {
            "alpha": m.alpha,
            "c": m.c,
            "b": m.b,
            "a": {str(k): v for k, v in sorted(m.a.items())},
            "d": {str(k): v for k, v in sorted(m.d.items())},
        },
    }
