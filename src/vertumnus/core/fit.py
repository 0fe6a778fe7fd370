"""Fit E_C(R, P) from queue-free profile measurements (design.md section 2).

A profile is a grid of measurements ``(degree, uncached R, cached P, seconds)``
taken with an empty queue. The model is linear in its coefficients, so the fit
is a non-negative least-squares problem over the unknowns

    d_C for every degree C,  a,  b,  c,  α

with one row per measurement: ``[1{C}, R, P, R/C, W(R,P)/C]``.

The per-token term is fitted as one ``a`` shared by all degrees: with a free
``a_C`` per degree, the coefficient of R at degree C is ``a_C + c/C`` and c
could not be told apart from the a_C (any c fits equally well). A shared
``a`` makes every coefficient identifiable as soon as two degrees are
profiled. With a single degree, ``a`` and ``c`` merge and ``a`` is set to 0.

Rows are weighted by 1/seconds, i.e. we minimise *relative* error: profiles
span three orders of magnitude (1K to 128K tokens) and an absolute fit would
ignore short prompts entirely, which are most requests. The reported error is
the mean absolute percentage error (MAPE) per degree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from vertumnus.core.costmodel import PrefillModel, attention_pairs


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One queue-free measurement: a degree-``degree`` worker prefilled
    ``uncached`` tokens after ``cached`` cached ones in ``seconds``."""

    degree: int
    uncached: int
    cached: int
    seconds: float


@dataclass(frozen=True)
class FitResult:
    model: PrefillModel
    mape_by_degree: dict[int, float]
    """Mean absolute percentage error per degree, as a fraction (0.02 = 2 %)."""
    rows_by_degree: dict[int, int]

    @property
    def mape(self) -> float:
        total = sum(self.rows_by_degree.values())
        return sum(self.mape_by_degree[c] * n for c, n in self.rows_by_degree.items()) / total


def fit_profile(
    rows: Sequence[ProfileRow], name: str = "fitted", max_tokens_per_gpu: int = 131072
) -> FitResult:
    """Non-negative least squares fit of E_C to ``rows``; raises ValueError on unusable input."""
    if not rows:
        raise ValueError("profile has no rows")
    for i, r in enumerate(rows):
        if r.degree < 1 or r.uncached < 1 or r.cached < 0 or not r.seconds > 0:
            raise ValueError(
                f"profile row {i + 1}: need degree >= 1, uncached >= 1, cached >= 0, seconds > 0; got {r}"
            )
    degrees = sorted({r.degree for r in rows})
    col = {deg: i for i, deg in enumerate(degrees)}
    k = len(degrees)
    # columns: d_C (k) | a | b | c | alpha
    x = np.zeros((len(rows), k + 4))
    y = np.empty(len(rows))
    for i, r in enumerate(rows):
        x[i, col[r.degree]] = 1.0
        x[i, k] = r.uncached if k > 1 else 0.0
        x[i, k + 1] = r.cached
        x[i, k + 2] = r.uncached / r.degree
        x[i, k + 3] = attention_pairs(r.uncached, r.cached) / r.degree
        y[i] = r.seconds
    for deg in degrees:
        uncached = {r.uncached for r in rows if r.degree == deg}
        if len(uncached) < 2:
            raise ValueError(
                f"degree {deg}: need measurements at >= 2 distinct uncached lengths to separate d_C from the per-token cost"
            )
    # Scale columns to unit norm so the solver is well conditioned (seconds
    # per pair and seconds per request differ by ~10 orders of magnitude).
    w = 1.0 / y
    xw = x * w[:, None]
    norms = np.linalg.norm(xw, axis=0)
    norms[norms == 0] = 1.0
    coef_scaled, _ = nnls(xw / norms, y * w, maxiter=50 * x.shape[1])
    coef = coef_scaled / norms
    model = PrefillModel(
        name=name,
        alpha=float(coef[k + 3]),
        c=float(coef[k + 2]),
        b=float(coef[k + 1]),
        d={deg: float(coef[col[deg]]) for deg in degrees},
        a={deg: float(coef[k]) for deg in degrees},
        max_tokens_per_gpu=max_tokens_per_gpu,
    )
    mape: dict[int, float] = {}
    counts: dict[int, int] = {}
    for deg in degrees:
        errs = [
            abs(model.predict(deg, r.uncached, r.cached) - r.seconds) / r.seconds
            for r in rows
            if r.degree == deg
        ]
        mape[deg] = float(np.mean(errs))
        counts[deg] = len(errs)
    return FitResult(model=model, mape_by_degree=mape, rows_by_degree=counts)


def synthesize_profile(
    model: PrefillModel,
    uncached: Sequence[int],
    cached: Sequence[int],
    noise: float,
    rng: np.random.Generator,
) -> list[ProfileRow]:
    """A profile grid generated from ``model`` with multiplicative Gaussian
    noise of relative standard deviation ``noise``: for testing the fit."""
    rows = []
    for deg in model.degrees:
        for r in uncached:
            for p in cached:
                t = model.predict(deg, r, p) * float(1.0 + noise * rng.standard_normal())
                rows.append(ProfileRow(deg, r, p, max(t, 1e-9)))
    return rows
