"""Run named policies over a trace and summarise them: what ``vertumnus simulate`` does.

A **policy spec** names a policy kind and, for fixed pools, a composition:
``vertumnus:4xCP4+3xCP8``, ``round-robin:10xCP4``, ``vertumnus-adaptive``.
The kinds live in :mod:`vertumnus.sim.registry`; each builds a
:class:`~vertumnus.sim.engine.Simulation` for the trace and settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from vertumnus.core.metrics import Completion, load_imbalance, summarize
from vertumnus.core.planner import PlannerSettings
from vertumnus.core.types import Composition
from vertumnus.sim.engine import SimResult
from vertumnus.sim.registry import KINDS
from vertumnus.sim.settings import PolicySpec, RunSettings
from vertumnus.sim.traces import Trace

__all__ = [
    "PolicyRun",
    "PolicySpec",
    "RunSettings",
    "parse_planner_settings",
    "parse_policy_specs",
    "phase_summaries",
    "run_policy",
]


def parse_policy_specs(text: str, gpus: int) -> list[PolicySpec]:
    """Parse ``KIND[:COMPOSITION],...``; ValueError names the bad entry."""
    specs: list[PolicySpec] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            raise ValueError(f"empty policy in --compare {text!r}")
        kind, _, comp_text = entry.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(
                f"unknown policy {kind!r} in {entry!r}; known: {', '.join(sorted(KINDS))}"
            )
        comp: Composition | None = None
        if comp_text.strip():
            try:
                comp = Composition.parse(comp_text)
            except ValueError as e:
                raise ValueError(f"policy {entry!r}: {e}") from None
            if comp.gpus > gpus:
                raise ValueError(
                    f"policy {entry!r}: composition {comp} uses {comp.gpus} GPUs, more than --gpus {gpus}"
                )
            if not KINDS[kind].needs_composition and comp.gpus != gpus:
                # An adaptive pool starts from the composition given (instead of
                # the planner's pick) and keeps the whole budget.
                raise ValueError(
                    f"policy {entry!r}: {kind} starts from the composition given and "
                    f"keeps all --gpus {gpus} GPUs, but {comp} uses {comp.gpus}; give a "
                    f"{gpus}-GPU composition, or none to let the planner choose"
                )
        elif KINDS[kind].needs_composition:
            raise ValueError(f"policy {kind!r} needs a composition, e.g. {kind}:4xCP4+3xCP8")
        spec = PolicySpec(kind, comp)
        if spec.label in {s.label for s in specs}:
            raise ValueError(f"policy {spec.label!r} given twice")
        specs.append(spec)
    return specs


@dataclass
class PolicyRun:
    spec: PolicySpec
    result: SimResult
    wall_s: float
    phases: tuple[tuple[float, float, str], ...] = ()

    def report(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(summarize(self.result.completions).as_dict())
        busy = self.result.busy_fraction
        s.update(
            rejected=len(self.result.rejected),
            load_imbalance=load_imbalance(busy.values()),
            mean_busy_fraction=float(np.mean(list(busy.values()))) if busy else 0.0,
            busy_fraction_by_worker={str(w): b for w, b in sorted(busy.items())},
            reconfigurations=self.result.reconfigurations,
            composition_timeline=[
                {"t_s": t, "composition": c} for t, c in self.result.composition_timeline
            ],
            wall_s=self.wall_s,
        )
        if self.phases:
            s["phases"] = phase_summaries(self.result.completions, self.phases)
        return s


def phase_summaries(
    completions: Sequence[Completion], phases: Sequence[tuple[float, float, str]]
) -> list[dict[str, Any]]:
    out = []
    for start, end, label in phases:
        inside = [c for c in completions if start <= c.arrival_s < end]
        sm = summarize(inside)
        out.append(
            {
                "label": label,
                "start_s": start,
                "end_s": end,
                "requests": sm.requests,
                "mean_ttft_s": sm.mean_ttft_s,
                "p90_ttft_s": sm.p90_ttft_s,
                "slo_attainment": sm.slo_attainment,
            }
        )
    return out


def run_policy(
    spec: PolicySpec,
    trace: Trace,
    settings: RunSettings,
    progress: Callable[[int], None] | None = None,
) -> PolicyRun:
    sim = KINDS[spec.kind].build(spec, trace, settings)
    t0 = time.perf_counter()
    result = sim.run(trace.requests, progress)
    return PolicyRun(spec, result, time.perf_counter() - t0, settings.phases)


def parse_planner_settings(text: str | None) -> PlannerSettings:
    """:class:`PlannerSettings` from ``"name=value,..."`` (None or empty: the defaults).

    Numbers as usual, booleans as ``true``/``false``, the degree list as
    ``degrees=4/8``. Raises ValueError naming the setting at fault; the
    ranges are checked by PlannerSettings itself.
    """
    base = PlannerSettings()
    known = {f.name: f for f in fields(PlannerSettings)}
    changes: dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        name, sep, value = (x.strip() for x in item.partition("="))
        if not sep or not value:
            raise ValueError(f"planner setting {item!r}: expected NAME=VALUE")
        if name not in known:
            raise ValueError(f"unknown planner setting {name!r} (known: {', '.join(known)})")
        current = getattr(base, name)
        try:
            if isinstance(current, bool):
                if value.lower() not in ("true", "false"):
                    raise ValueError
                changes[name] = value.lower() == "true"
            elif isinstance(current, tuple):
                changes[name] = tuple(int(v) for v in value.split("/"))
            else:
                changes[name] = type(current)(value)
        except ValueError:
            kind = {bool: "true or false", tuple: "integers joined by '/'", int: "an integer"}.get(
                type(current), "a number"
            )
            raise ValueError(f"planner setting {name}: expected {kind}, got {value!r}") from None
    return replace(base, **changes)
