"""Serving metrics (design.md section 7).

- TTFT: mean and P50 / P90 / P99 (linear-interpolated percentiles).
- Token-weighted TTFT SLO attainment: Σ L_i·1[TTFT_i ≤ τ_i] / Σ L_i.
- Token-level prefix-cache hit rate: cached input tokens / input tokens.
- Per-worker busy fraction and load imbalance (max / mean busy fraction).

**The SLO rule (τ_i).** The paper does not fix τ_i. We hold each request to a
multiple of its *isolated* prefill time — no queue, no cached prefix — on the
largest degree available, with a floor:

    τ_i = max(floor_s, scale · E_{C_max}(L_i, 0))

Defaults: ``scale = 5``, ``floor_s = 2 s``. The multiple makes the target
proportional to the work a request brings (a 128K-token prompt cannot start
in 50 ms, a 1K one should not wait 10 s); the floor keeps short prompts from
being held to tens of milliseconds, below the scheduling and transfer
overheads of any real deployment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from vertumnus.core.costmodel import PrefillModel


@dataclass(frozen=True, slots=True)
class SloRule:
    scale: float = 5.0
    """τ is this multiple of the isolated prefill time on the largest degree."""
    floor_s: float = 2.0
    """τ is never below this many seconds."""

    def __post_init__(self) -> None:
        if self.scale <= 0 or self.floor_s < 0:
            raise ValueError(f"SLO rule needs scale > 0 and floor >= 0, got {self}")

    def tau(self, model: PrefillModel, length: int, max_degree: int) -> float:
        return max(self.floor_s, self.scale * model.predict(max_degree, length, 0))


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished prefill, as the metrics see it."""

    request_id: int
    arrival_s: float
    length: int
    cached_tokens: int
    ttft_s: float
    worker: int
    degree: int
    tau_s: float


@dataclass(frozen=True)
class Summary:
    requests: int
    mean_ttft_s: float
    p50_ttft_s: float
    p90_ttft_s: float
    p99_ttft_s: float
    slo_attainment: float
    token_hit_rate: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "mean_ttft_s": self.mean_ttft_s,
            "p50_ttft_s": self.p50_ttft_s,
            "p90_ttft_s": self.p90_ttft_s,
            "p99_ttft_s": self.p99_ttft_s,
            "slo_attainment": self.slo_attainment,
            "token_hit_rate": self.token_hit_rate,
        }


def summarize(completions: Sequence[Completion]) -> Summary:
    if not completions:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan)
    ttft = np.fromiter((c.ttft_s for c in completions), dtype=float, count=len(completions))
    length = np.fromiter((c.length for c in completions), dtype=float, count=len(completions))
    tau = np.fromiter((c.tau_s for c in completions), dtype=float, count=len(completions))
    cached = np.fromiter(
        (c.cached_tokens for c in completions), dtype=float, count=len(completions)
    )
    p50, p90, p99 = np.percentile(ttft, [50, 90, 99])
    return Summary(
        requests=len(completions),
        mean_ttft_s=float(ttft.mean()),
        p50_ttft_s=float(p50),
        p90_ttft_s=float(p90),
        p99_ttft_s=float(p99),
        slo_attainment=float((length * (ttft <= tau)).sum() / length.sum()),
        token_hit_rate=float(cached.sum() / length.sum()),
    )


def load_imbalance(busy_fractions: Iterable[float]) -> float:
    """max / mean worker busy fraction (1.0 = perfectly even)."""
    b = list(busy_fractions)
    mean = sum(b) / len(b) if b else 0.0
    return max(b) / mean if mean > 0 else 1.0
