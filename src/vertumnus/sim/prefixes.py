"""Synthetic shared prefixes for traces that carry none (the Azure 2023 traces).

The Azure LLM inference traces give arrival times and lengths only, so every
request's blocks are its own (:func:`~vertumnus.sim.traces.load_azure`) and
no cache can ever hit. :func:`with_prefixes` gives them the one kind of
reuse every production deployment has — shared system prompts and tool
preambles — without touching arrivals or lengths: a request draws one of
``n`` prompts (Zipf popularity, lognormal lengths) with probability
``share``, and its leading whole blocks, as far as the prompt and the request
reach, become that prompt's blocks. The rest of the request stays unique.

``--prefixes n=16,zipf=1.1,median=1024,share=0.9`` on ``vertumnus simulate``
(:func:`parse_prefix_options`). Seeded: the same options and seed give the
same trace.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from vertumnus.core.keys import chain_many
from vertumnus.core.types import Request
from vertumnus.sim.traces import Trace

__all__ = ["PrefixOptions", "parse_prefix_options", "with_prefixes"]


@dataclass(frozen=True)
class PrefixOptions:
    """The synthetic prompt pool (see the module docstring)."""

    n: int = 16
    """Distinct shared prompts."""
    zipf: float = 1.1
    """Zipf exponent of their popularity."""
    median: float = 1024.0
    """Median prompt length in tokens (lognormal, sigma 0.5)."""
    share: float = 0.9
    """Fraction of requests that start with a shared prompt."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"prefixes: n must be >= 1, got {self.n}")
        if self.zipf < 0:
            raise ValueError(f"prefixes: zipf must be >= 0, got {self.zipf}")
        if not self.median > 0:
            raise ValueError(f"prefixes: median must be > 0, got {self.median}")
        if not 0 <= self.share <= 1:
            raise ValueError(f"prefixes: share must be in [0, 1], got {self.share}")


def parse_prefix_options(text: str) -> PrefixOptions:
    """``n=16,zipf=1.1,...`` → :class:`PrefixOptions`; ValueError names the bad item."""
    types = {f.name: f.type for f in fields(PrefixOptions)}
    values: dict[str, float | int] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = (x.strip() for x in item.partition("="))
        if not sep or key not in types:
            raise ValueError(
                f"prefixes: bad item {item!r}; expected KEY=VALUE with KEY in {', '.join(types)}"
            )
        try:
            values[key] = int(value) if key == "n" else float(value)
        except ValueError:
            raise ValueError(f"prefixes: {key}={value!r} is not a number") from None
    return PrefixOptions(**values)  # type: ignore[arg-type]


def with_prefixes(trace: Trace, options: PrefixOptions, seed: int = 0) -> Trace:
    """``trace`` with shared prompt prefixes (module docstring); arrivals and lengths kept."""
    rng = np.random.default_rng(seed)
    bs = trace.block_size
    ranks = np.arange(1, options.n + 1, dtype=np.float64)
    popularity = ranks ** (-options.zipf)
    popularity /= popularity.sum()
    prompt_blocks = np.maximum(
        1, (rng.lognormal(np.log(options.median), 0.5, options.n) // bs).astype(np.int64)
    )
    n = len(trace)
    takes = rng.random(n) < options.share
    which = rng.choice(options.n, size=n, p=popularity)
    # Block ids: prompt k's j-th block is k * stride + j; unique blocks follow them all.
    stride = int(prompt_blocks.max())
    next_id = options.n * stride
    lists: list[list[int]] = []
    for i, r in enumerate(trace.requests):
        nb = -(-r.length // bs)
        shared = 0
        if takes[i]:
            # Whole blocks only, and never the request's last block: a prompt is
            # followed by the request's own text.
            shared = min(int(prompt_blocks[which[i]]), r.length // bs, nb - 1)
        k = int(which[i])
        ids = [k * stride + j for j in range(shared)]
        ids += range(next_id, next_id + nb - shared)
        next_id += nb - shared
        lists.append(ids)
    keys = chain_many(lists)
    requests = tuple(
        Request(r.id, r.arrival_s, r.length, k, r.output_length)
        for r, k in zip(trace.requests, keys, strict=True)
    )
    return Trace(f"{trace.name}+prefixes", requests, bs)
