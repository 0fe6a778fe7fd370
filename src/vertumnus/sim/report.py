"""Presenting simulated runs: a table for people, JSON for tools, a TTFT-over-time plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.sim.runner import PolicyRun

_COLUMNS = (
    ("policy", "{}"),
    ("requests", "{:d}"),
    ("mean TTFT s", "{:.3f}"),
    ("P90 TTFT s", "{:.3f}"),
    ("P99 TTFT s", "{:.3f}"),
    ("SLO att.", "{:.3f}"),
    ("hit rate", "{:.3f}"),
    ("imbalance", "{:.2f}"),
)


def table(runs: Sequence[PolicyRun]) -> str:
    """A fixed-width comparison table, one policy per row."""
    rows = []
    for run in runs:
        r = run.report()
        rows.append(
            [
                run.spec.label,
                r["requests"],
                r["mean_ttft_s"],
                r["p90_ttft_s"],
                r["p99_ttft_s"],
                r["slo_attainment"],
                r["token_hit_rate"],
                r["load_imbalance"],
            ]
        )
    cells = [[h for h, _ in _COLUMNS]] + [
        [fmt.format(v) for (_, fmt), v in zip(_COLUMNS, row, strict=True)] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = []
    for k, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)
            )
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    best = min(runs, key=lambda r: r.report()["mean_ttft_s"])
    lines.append("")
    lines.append(f"lowest mean TTFT: {best.spec.label}")
    for run in runs:
        if run is not best:
            ratio = run.report()["mean_ttft_s"] / best.report()["mean_ttft_s"]
            lines.append(f"  {run.spec.label}: {ratio:.2f}x its mean TTFT")
    return "\n".join(lines)


def to_json(runs: Sequence[PolicyRun], meta: dict[str, Any]) -> dict[str, Any]:
    return {"policies": {run.spec.label: run.report() for run in runs}, **meta}


def write_json(runs: Sequence[PolicyRun], meta: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(runs, meta), indent=2, allow_nan=True) + "\n")


def ttft_over_time(run: PolicyRun, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean TTFT of the requests arriving in each ``bin_s`` bin (NaN where none)."""
    comps = run.result.completions
    if not comps:
        return np.array([]), np.array([])
    arrival = np.array([c.arrival_s for c in comps])
    ttft = np.array([c.ttft_s for c in comps])
    idx = (arrival // bin_s).astype(int)
    n = int(idx.max()) + 1
    sums = np.bincount(idx, weights=ttft, minlength=n)
    counts = np.bincount(idx, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return (np.arange(n) + 0.5) * bin_s, means


def plot(runs: Sequence[PolicyRun], path: str | Path, title: str) -> None:
    """TTFT over time per policy; compositions over time beneath when they change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = max((r.result.span_s for r in runs), default=1.0)
    bin_s = max(span / 120.0, 1.0)
    adaptive = [r for r in runs if len(r.result.composition_timeline) > 1]
    nrows = 2 if adaptive else 1
    fig, axes = plt.subplots(
        nrows,
        1,
        figsize=(10, 4.5 + 1.5 * (nrows - 1)),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1] if adaptive else [1]},
    )
    ax = axes[0][0]
    for run in runs:
        t, m = ttft_over_time(run, bin_s)
        ax.plot(t, m, label=run.spec.label, linewidth=1.2)
    for start, _end, label in runs[0].phases if runs else ():
        ax.axvline(start, color="grey", linewidth=0.6, linestyle=":")
        ax.text(start, 1.0, f" {label}", transform=ax.get_xaxis_transform(), fontsize=7, va="top")
    ax.set_ylabel(f"mean TTFT (s), {bin_s:.0f} s bins")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if adaptive:
        ax2 = axes[1][0]
        for run in adaptive:
            tl = run.result.composition_timeline
            names = list(dict.fromkeys(c for _, c in tl))
            xs = [t for t, _ in tl] + [span]
            ys = [names.index(c) for _, c in tl]
            ax2.step(xs, ys + [ys[-1]], where="post", label=run.spec.label)
            ax2.set_yticks(range(len(names)), names, fontsize=7)
        ax2.set_ylabel("composition")
        ax2.grid(alpha=0.3)
    axes[-1][0].set_xlabel("arrival time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
