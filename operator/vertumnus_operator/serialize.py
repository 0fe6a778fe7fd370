"""The core's state values as JSON, for the CPPool status (``status.state``).

The serving core keeps the pool's grouping and transitions (:class:`~vertumnus.core.
transition.PoolState`), the planner's memory (:class:`~vertumnus.core.planner.
ControllerState`) and the controller's own (:class:`~vertumnus.core.memory.Memory`:
flaps, the what-if check's streaks, a move's goal, the learned κ) as frozen dataclasses
with no I/O. The operator records them in the CPPool status before it acts on them,
and reads them back after a restart, so that :func:`vertumnus.core.transition.resume`
carries on from the recorded phase and the controller from its memory. This module is
that round trip, explicit per type (a generic pickle-like encoder would silently
follow changes of the core's classes; this one fails loudly, naming the field).

``decode(encode(x)) == x`` for every value the operator records (tested with hypothesis
in ``tests/operator/test_serialize.py``), except the planner's ``history`` of reasons,
which is trimmed to its last :data:`HISTORY_KEPT` entries (it only feeds reports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.kappa import LearnedBins
from vertumnus.core.lattice import Layout, Slot
from vertumnus.core.memory import Look, Memory
from vertumnus.core.types import Composition

__all__ = [
    "HISTORY_KEPT",
    "StateError",
    "decode_controller",
    "decode_layout",
    "decode_memory",
    "decode_op",
    "decode_pool",
    "encode_controller",
    "encode_layout",
    "encode_memory",
    "encode_op",
    "encode_pool",
]

HISTORY_KEPT = 20


class StateError(ValueError):
    """A recorded state that cannot be read back (the message names the field)."""


def _get(d: Mapping[str, Any], key: str, where: str) -> Any:
    try:
        return d[key]
    except (KeyError, TypeError):
        raise StateError(f"{where}.{key}: missing in the recorded state") from None


def encode_slot(s: Slot) -> list[int]:
    # Compact: a 1,024-GPU pool has up to 1,024 slots and the status has a size limit.
    return [s.worker, s.degree, s.domain, s.offset]


def decode_slot(raw: Any, where: str) -> Slot:
    if not isinstance(raw, list) or len(raw) != 4 or not all(isinstance(x, int) for x in raw):
        raise StateError(f"{where}: expected [worker, degree, domain, offset], got {raw!r}")
    return Slot(*raw)


def encode_layout(layout: Layout) -> dict[str, Any]:
    return {"domainSize": layout.domain_size, "slots": [encode_slot(s) for s in layout.slots]}


def decode_layout(raw: Mapping[str, Any], where: str = "layout") -> Layout:
    slots = _get(raw, "slots", where)
    return Layout(
        tuple(decode_slot(s, f"{where}.slots[{i}]") for i, s in enumerate(slots)),
        int(_get(raw, "domainSize", where)),
    )


def encode_op(op: tr.Op) -> dict[str, Any]:
    if isinstance(op, tr.Replace):
        return {"replace": op.worker, "reason": op.reason}
    if isinstance(op, planner.Split):
        return {"split": op.worker, "reason": op.reason}
    return {"merge": list(op.workers), "reason": op.reason}


def decode_op(raw: Mapping[str, Any], where: str = "op") -> tr.Op:
    reason = str(raw.get("reason", ""))
    if "replace" in raw:
        return tr.Replace(int(raw["replace"]), reason)
    if "split" in raw:
        return planner.Split(int(raw["split"]), reason)
    if "merge" in raw:
        a, b = raw["merge"]
        return planner.Merge((int(a), int(b)), reason)
    raise StateError(f"{where}: neither split, merge nor replace: {raw!r}")


def _planner_op(raw: Mapping[str, Any], where: str) -> planner.Op:
    op = decode_op(raw, where)
    if isinstance(op, tr.Replace):
        raise StateError(f"{where}: the planner never asks for a replacement: {raw!r}")
    return op


def encode_transition(t: tr.Transition) -> dict[str, Any]:
    return {
        "id": t.id,
        "op": encode_op(t.op),
        "removed": [encode_slot(s) for s in t.removed],
        "added": [encode_slot(s) for s in t.added],
        "phase": t.phase.value,
        "drained": sorted(t.drained),
        "epoch": t.epoch,
    }


def decode_transition(raw: Mapping[str, Any], where: str) -> tr.Transition:
    phase = _get(raw, "phase", where)
    try:
        ph = tr.Phase(phase)
    except ValueError:
        raise StateError(f"{where}.phase: unknown phase {phase!r}") from None
    return tr.Transition(
        id=int(_get(raw, "id", where)),
        op=decode_op(_get(raw, "op", where), f"{where}.op"),
        removed=tuple(decode_slot(s, f"{where}.removed") for s in _get(raw, "removed", where)),
        added=tuple(decode_slot(s, f"{where}.added") for s in _get(raw, "added", where)),
        phase=ph,
        drained=frozenset(int(w) for w in raw.get("drained", ())),
        epoch=int(raw.get("epoch", 0)),
    )


def encode_pool(pool: tr.PoolState) -> dict[str, Any]:
    return {
        "layout": encode_layout(pool.layout),
        "epoch": pool.epoch,
        "nextWorker": pool.next_worker,
        "nextTransition": pool.next_transition,
        "transitions": [encode_transition(t) for t in pool.transitions],
    }


def decode_pool(raw: Mapping[str, Any], where: str = "status.state.pool") -> tr.PoolState:
    return tr.PoolState(
        layout=decode_layout(_get(raw, "layout", where), f"{where}.layout"),
        epoch=int(_get(raw, "epoch", where)),
        next_worker=int(_get(raw, "nextWorker", where)),
        next_transition=int(_get(raw, "nextTransition", where)),
        transitions=tuple(
            decode_transition(t, f"{where}.transitions[{i}]")
            for i, t in enumerate(raw.get("transitions", ()))
        ),
    )


def _encode_window(w: planner.WindowObservation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "demand": w.demand_s,
        "requests": w.requests,
        "long": w.long_requests,
        "longDemand": w.long_demand_s,
        "reconfiguring": w.reconfiguring,
    }
    if w.workers:
        out["workers"] = [[o.worker, o.running_remaining_s, o.reuse_weight] for o in w.workers]
    for key, value in (
        ("freshDemand", w.fresh_demand_s),
        ("freshLong", w.fresh_long_requests),
        ("freshLongDemand", w.fresh_long_demand_s),
    ):
        if value is not None:
            out[key] = value
    return out


def _decode_window(raw: Mapping[str, Any], where: str) -> planner.WindowObservation:
    fresh_long = raw.get("freshLong")
    return planner.WindowObservation(
        demand_s=float(_get(raw, "demand", where)),
        requests=int(_get(raw, "requests", where)),
        long_requests=int(_get(raw, "long", where)),
        long_demand_s=float(raw.get("longDemand", 0.0)),
        workers=tuple(
            planner.WorkerObservation(int(w), float(r), float(u))
            for w, r, u in raw.get("workers", ())
        ),
        reconfiguring=bool(raw.get("reconfiguring", False)),
        fresh_demand_s=None if raw.get("freshDemand") is None else float(raw["freshDemand"]),
        fresh_long_requests=None if fresh_long is None else int(fresh_long),
        fresh_long_demand_s=(
            None if raw.get("freshLongDemand") is None else float(raw["freshLongDemand"])
        ),
    )


def encode_controller(state: planner.ControllerState) -> dict[str, Any]:
    return {
        "layout": encode_layout(state.layout),
        "epoch": state.epoch,
        "splitStreak": state.split_streak,
        "mergeStreak": state.merge_streak,
        "momentum": state.momentum,
        "pending": [encode_op(op) for op in state.pending],
        "confirming": [_encode_window(w) for w in state.confirming],
        "target": None if state.target is None else str(state.target),
        "plan": [_encode_window(w) for w in state.plan],
        "history": list(state.history[-HISTORY_KEPT:]),
    }


def decode_controller(
    raw: Mapping[str, Any], where: str = "status.state.controller"
) -> planner.ControllerState:
    target = raw.get("target")
    momentum = raw.get("momentum")
    if momentum not in (None, "split", "merge"):
        raise StateError(f"{where}.momentum: expected split, merge or null, got {momentum!r}")
    return planner.ControllerState(
        layout=decode_layout(_get(raw, "layout", where), f"{where}.layout"),
        epoch=int(raw.get("epoch", 0)),
        split_streak=int(raw.get("splitStreak", 0)),
        merge_streak=int(raw.get("mergeStreak", 0)),
        momentum=momentum,
        pending=tuple(
            _planner_op(o, f"{where}.pending[{i}]") for i, o in enumerate(raw.get("pending", ()))
        ),
        confirming=tuple(
            _decode_window(w, f"{where}.confirming[{i}]")
            for i, w in enumerate(raw.get("confirming", ()))
        ),
        target=None if target is None else Composition.parse(target),
        plan=tuple(
            _decode_window(w, f"{where}.plan[{i}]") for i, w in enumerate(raw.get("plan", ()))
        ),
        history=tuple(str(h) for h in raw.get("history", ())),
    )


def encode_memory(m: Memory) -> dict[str, Any]:
    return {
        "evaluations": m.evaluations,
        "flaps": list(m.flaps),
        "lastMove": None if m.last_move is None else list(m.last_move),
        "streak": list(m.streak),
        "lean": [m.lean[0], list(m.lean[1])],
        "looks": [m.looks[0], [list(look) for look in m.looks[1]]],
        "recall": _encode_recall(m.recall),
        "goal": None if m.goal is None else [m.goal[0], str(m.goal[1])],
        "kappa": None if m.kappa is None else _encode_learned(m.kappa),
    }


def _encode_recall(looks: Sequence[Look]) -> dict[str, Any]:
    """The recall's looks as a table: the merge candidates named once, and per look its
    long fraction and each candidate's gain (null where it did not estimate it), so
    that a record written every hop stays small."""
    names = sorted({comp for look in looks for comp, _ in look.merges})
    column = {name: i for i, name in enumerate(names)}
    rows = []
    for look in looks:
        gains: list[float | None] = [None] * len(names)
        for comp, gain in look.merges:
            gains[column[comp]] = gain
        rows.append([look.long_fraction, gains])
    return {"compositions": names, "looks": rows}


def _decode_recall(raw: Any, where: str) -> tuple[Look, ...]:
    if raw is None:
        return ()  # a record written before the recall was kept
    names = raw.get("compositions") if isinstance(raw, dict) else None
    rows = raw.get("looks") if isinstance(raw, dict) else None
    if not isinstance(names, list) or not isinstance(rows, list):
        raise StateError(f"{where}: expected {{compositions: [...], looks: [...]}}, got {raw!r}")
    for name in names:
        try:
            Composition.parse(name)
        except (TypeError, ValueError) as e:
            raise StateError(f"{where}.compositions: {name!r} is not a composition ({e})") from None
    looks = []
    for i, row in enumerate(rows):
        ok = isinstance(row, list) and len(row) == 2 and _numbers(row[:1])
        if not ok or not isinstance(row[1], list) or len(row[1]) != len(names):
            raise StateError(
                f"{where}.looks[{i}]: expected [long fraction, one gain or null per "
                f"composition ({len(names)})], got {row!r}"
            )
        if not all(g is None or _numbers([g]) for g in row[1]):
            raise StateError(f"{where}.looks[{i}]: a gain must be a number or null, got {row[1]!r}")
        merges = tuple((n, float(g)) for n, g in zip(names, row[1], strict=True) if g is not None)
        looks.append(Look(float(row[0]), merges))
    return tuple(looks)


def _numbers(values: Any) -> bool:
    """Every value is a JSON number."""
    return all(isinstance(x, (int, float)) for x in values)


def _encode_learned(k: LearnedBins) -> dict[str, Any]:
    # Only the bins with weight: a few of the 60 per degree in a steady pool.
    return {
        "samples": k.samples,
        "bins": {str(d): [list(row) for row in rows] for d, rows in k.bins.items()},
    }


def _decode_learned(raw: Any, where: str) -> LearnedBins:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("bins", {}), Mapping):
        raise StateError(f"{where}: expected {{samples, bins: {{degree: rows}}}}, got {raw!r}")
    bins: dict[int, tuple[tuple[int, float, float, float, float], ...]] = {}
    for d, rows in raw.get("bins", {}).items():
        ok = str(d).isdigit() and isinstance(rows, list)
        ok = ok and all(
            isinstance(row, list)
            and len(row) == 5
            and isinstance(row[0], int)
            and _numbers(row[1:])
            for row in rows
        )
        if not ok:
            raise StateError(f"{where}.bins.{d}: expected rows [bin, w, a, a2, r], got {rows!r}")
        bins[int(d)] = tuple(
            (row[0], float(row[1]), float(row[2]), float(row[3]), float(row[4])) for row in rows
        )
    samples = raw.get("samples", 0)
    if not isinstance(samples, int):
        raise StateError(f"{where}.samples: expected an integer, got {samples!r}")
    try:
        return LearnedBins(bins, samples)
    except ValueError as e:
        raise StateError(f"{where}: {e}") from None


def decode_memory(raw: Mapping[str, Any], where: str = "status.state.memory") -> Memory:
    def pair(key: str, kinds: tuple[type, type], shape: str = "[direction, value]") -> Any:
        value = raw.get(key)
        if value is None:
            return None
        ok = isinstance(value, list) and len(value) == 2
        if not ok or not all(isinstance(v, k) for v, k in zip(value, kinds, strict=True)):
            raise StateError(f"{where}.{key}: expected {shape}, got {value!r}")
        return value

    evaluations = raw.get("evaluations", 0)
    flaps = raw.get("flaps", [])
    if not isinstance(evaluations, int) or not isinstance(flaps, list):
        raise StateError(f"{where}: evaluations must be an integer and flaps a list")
    if not all(isinstance(f, int) for f in flaps):
        raise StateError(f"{where}.flaps: expected evaluations (integers), got {flaps!r}")
    last = pair("lastMove", (str, int))
    streak = pair("streak", (str, int)) or ["", 0]
    lean = pair("lean", (str, list)) or ["", []]
    if not _numbers(lean[1]):
        raise StateError(f"{where}.lean: expected gains (numbers), got {lean[1]!r}")
    looks = pair("looks", (str, list), "[composition, [[split gain, merge gain], ...]]") or ["", []]
    if not all(isinstance(x, list) and len(x) == 2 and _numbers(x) for x in looks[1]):
        raise StateError(
            f"{where}.looks: expected [split gain, merge gain] pairs, got {looks[1]!r}"
        )
    recall = _decode_recall(raw.get("recall"), f"{where}.recall")
    goal = pair("goal", (str, str))
    learned = raw.get("kappa")
    kappa = None if learned is None else _decode_learned(learned, f"{where}.kappa")
    try:
        return Memory(
            evaluations=evaluations,
            flaps=tuple(flaps),
            last_move=None if last is None else (last[0], last[1]),
            streak=(streak[0], streak[1]),
            lean=(lean[0], tuple(float(g) for g in lean[1])),
            looks=(looks[0], tuple((float(a), float(b)) for a, b in looks[1])),
            recall=recall,
            goal=None if goal is None else (goal[0], Composition.parse(goal[1])),
            kappa=kappa,
        )
    except ValueError as e:
        raise StateError(f"{where}: {e}") from None
