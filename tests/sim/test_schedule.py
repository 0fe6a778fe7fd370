"""A pool that follows a schedule of compositions (vertumnus.sim.schedule)."""

from __future__ import annotations

import re

import pytest

from vertumnus.core import planner
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.types import Composition
from vertumnus.sim.reconfig import AdaptiveOptions
from vertumnus.sim.schedule import Move, build_scheduled

from ..planner.helpers import two_phase_trace

OPTIONS = AdaptiveOptions(gpus=16, control=planner.PlannerSettings(window_s=5.0))


def _moves(*pairs: tuple[float, str]) -> list[Move]:
    return [Move(t, Composition.parse(c)) for t, c in pairs]


def test_the_pool_reaches_each_scheduled_composition_and_loses_nothing(
    model: PrefillModel,
) -> None:
    trace = two_phase_trace()
    moves = _moves((0.0, "2xCP8"), (20.0, "4xCP4"), (70.0, "2xCP4+1xCP8"))
    sim = build_scheduled(trace, model, moves, OPTIONS)
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == list(range(len(trace)))
    assert result.rejected == []
    done = sim.attachments["executor"].transitions
    # Two splits from 20 s, then one merge from 70 s. The splits are chained (the
    # second starts at the first one's commit): both at once would leave nothing serving.
    assert [t.kind for t in done] == ["split", "split", "merge"]
    assert done[0].started_s == 20.0 and done[1].started_s == done[0].committed_s
    assert done[2].started_s >= 70.0
    assert result.composition_timeline[-1][1] == "2xCP4+1xCP8"
    assert done[-1].reason == "scheduled: 2xCP4+1xCP8"


def test_a_move_scheduled_in_flight_takes_over_at_the_next_commit(model: PrefillModel) -> None:
    """8 GPUs, 1xCP8 → 2xCP4 → 4xCP2, but back to 1xCP8 scheduled before the splits end."""
    trace = two_phase_trace()
    options = AdaptiveOptions(
        gpus=8,
        control=planner.PlannerSettings(window_s=5.0, degrees=(2, 4, 8), max_concurrent_ops=1),
    )
    sim = build_scheduled(
        trace, model, _moves((0.0, "1xCP8"), (10.0, "4xCP2"), (10.1, "1xCP8")), options
    )
    result = sim.run(trace.requests)
    assert sorted(c.request_id for c in result.completions) == list(range(len(trace)))
    kinds = [t.kind for t in sim.attachments["executor"].transitions]
    assert kinds == ["split", "merge"]  # 4xCP2 was never reached
    assert result.composition_timeline[-1][1] == "1xCP8"
    assert sim.attachments["schedule"].target is None  # arrived, nothing left to do


@pytest.mark.parametrize(
    ("moves", "message"),
    [
        ([(5.0, "2xCP8")], "needs a move at 0 s"),
        ([(-1.0, "2xCP8"), (0.0, "2xCP8")], "needs a move at 0 s"),
        ([(0.0, "2xCP8"), (5.0, "4xCP8")], "is not a 16-GPU composition"),
        ([(0.0, "2xCP8"), (5.0, "16xCP1")], "is not a 16-GPU composition of degrees [4, 8]"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_move(
    model: PrefillModel, moves: list[tuple[float, str]], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_scheduled(two_phase_trace(), model, _moves(*moves), OPTIONS)
