"""``mix_evidence``: a change that reads the long share waits for enough long requests.

Pool: CP4/CP8 with κ_4 = 0.5/s and κ_8 = 0.6/s, 20-second windows, the
default thresholds and ``mix_margin`` = 0.2, so the long share must be read
from ⌈1/(4·0.2²)⌉ = 7 long requests. Large-degree capacity shares:
8xCP4+1xCP8 0.13, 6xCP4+2xCP8 0.286, 4xCP4+3xCP8 0.474.
"""

from __future__ import annotations

from dataclasses import replace

from vertumnus.core import planner
from vertumnus.core.planner import (
    CapacityProfile,
    ControllerState,
    PlannerSettings,
    Split,
    WindowObservation,
    advance,
    commit,
    initial_state,
    layout_for,
    step,
)
from vertumnus.core.types import Composition

CAP = CapacityProfile({4: 0.5, 8: 0.6})
ON = PlannerSettings()
OFF = replace(ON, mix_evidence=False)


def start(comp: str) -> ControllerState:
    return initial_state(layout_for(Composition.parse(comp)))


def window(u: float, share: float, n_long: int, comp: str = "6xCP4+2xCP8", n: int = 34):
    """A window at utilization ``u`` of ``comp`` whose ``n_long`` long requests bring ``share``."""
    demand = u * CAP.capacity_per_s(Composition.parse(comp).degrees) * ON.window_s
    return WindowObservation(demand, n, n_long, share * demand)


def drive(state: ControllerState, windows, settings: PlannerSettings):
    """Step through ``windows``, committing every operation at once; the composition
    after each window."""
    next_id = 1000
    seen = []
    for w in windows:
        state, _ = step(state, w, CAP, settings)
        while state.pending:
            op = state.pending[0]
            new = [next_id, next_id + 1] if isinstance(op, Split) else [next_id]
            next_id += len(new)
            state = commit(state, new, op)
            state, _ = advance(state, (), CAP, settings)
        seen.append(str(state.layout.composition))
    return seen


def changes(seen: list[str], first: str) -> int:
    return sum(a != b for a, b in zip([first, *seen], seen, strict=False))


def test_the_long_request_count_follows_from_the_margin() -> None:
    assert planner.min_long_requests(ON) == 7  # 1/(4·0.04) = 6.25
    assert planner.min_long_requests(replace(ON, mix_margin=0.1)) == 25
    assert planner.min_long_requests(replace(ON, mix_margin=1.0)) == 1


#: Light load (u = 0.1) with ~2 long requests a window (Mooncake at rate
#: scale 0.5): the per-window long share swings between pairs that ask for a
#: low-utilization merge (≥ 0.474) and pairs that ask for a split (< 0.086).
THIN = [
    window(0.1, s, k)
    for s, k in [(0.55, 3), (0.5, 2), (0.05, 1), (0.0, 0), (0.6, 3), (0.52, 2), (0.03, 1)]
    + [(0.0, 0), (0.5, 2), (0.48, 2), (0.04, 1), (0.02, 1)] * 3
]


def test_thin_noisy_windows_do_not_flap() -> None:
    old = drive(start("6xCP4+2xCP8"), THIN, OFF)
    assert changes(old, "6xCP4+2xCP8") >= 4  # what the per-window reading did
    new = drive(start("6xCP4+2xCP8"), THIN, ON)
    assert set(new) == {"6xCP4+2xCP8"}


def test_a_real_mix_change_in_thin_windows_still_acts_once_the_evidence_is_in() -> None:
    # The long share stays at 0.04 (split threshold of 6xCP4+2xCP8: 0.086),
    # two long requests a window: 7 long requests take four windows.
    seen = drive(start("6xCP4+2xCP8"), [window(0.1, 0.04, 2)] * 6, ON)
    assert seen[:3] == ["6xCP4+2xCP8"] * 3
    assert seen[3] != "6xCP4+2xCP8"
    assert Composition.parse(seen[3]).degrees.count(8) < 2
    # Per-window reading: two windows.
    assert drive(start("6xCP4+2xCP8"), [window(0.1, 0.04, 2)] * 2, OFF)[1] != "6xCP4+2xCP8"


def test_thick_windows_act_after_persist_windows_as_before() -> None:
    ws = [window(0.1, 0.04, 8)] * 3
    assert drive(start("6xCP4+2xCP8"), ws, ON) == drive(start("6xCP4+2xCP8"), ws, OFF)
    assert drive(start("6xCP4+2xCP8"), ws, ON)[1] != "6xCP4+2xCP8"


def test_a_low_utilization_merge_needs_the_evidence_too() -> None:
    # Share 0.55 ≥ 4xCP4+3xCP8's 0.474 in every window, one long request each.
    ws = [window(0.1, 0.55, 1)] * 8
    seen = drive(start("6xCP4+2xCP8"), ws, ON)
    assert seen[5] == "6xCP4+2xCP8"  # six long requests: not yet
    assert seen[6] == "4xCP4+3xCP8"  # the seventh confirms
    assert drive(start("6xCP4+2xCP8"), ws, OFF)[1] == "4xCP4+3xCP8"


def test_the_target_is_planned_with_the_pooled_share() -> None:
    # Both windows ask for a low-utilization merge; the busy one's long share is
    # 0.9, the nearly idle one's 0.5. Pooled (Σ long demand / Σ demand) the
    # share is 0.875, enough for 2xCP4+4xCP8 (0.706); read window by window
    # the idle one stops the walk at 4xCP4+3xCP8 (0.474).
    ws = [window(0.3, 0.9, 4), window(0.02, 0.5, 4)]
    assert drive(start("6xCP4+2xCP8"), ws, ON)[-1] == "2xCP4+4xCP8"
    assert drive(start("6xCP4+2xCP8"), ws, OFF)[-1] == "4xCP4+3xCP8"


def test_capacity_splits_are_not_delayed_by_thin_windows() -> None:
    ws = [window(1.2, 0.3, 0, comp="5xCP8")] * 2
    assert drive(start("5xCP8"), ws, ON) == drive(start("5xCP8"), ws, OFF)
    assert drive(start("5xCP8"), ws, ON)[1] != "5xCP8"


def test_a_streak_without_long_requests_keeps_a_bounded_number_of_windows() -> None:
    """A window that asks for a split by its long share (0 < 0.086) but holds no long
    request waits for the evidence; the streak goes on, its windows do not pile up (the
    operator writes them into the CPPool status), and the evidence that comes confirms
    it from the windows kept."""
    empty = window(0.1, 0.0, 0)
    state = start("6xCP4+2xCP8")
    for _ in range(200):
        state, ops = step(state, empty, CAP, ON)
        assert ops == ()
    assert state.split_streak == 200
    assert len(state.confirming) == planner.EVIDENCE_WINDOWS_MAX == 64
    seen = drive(state, [window(0.1, 0.04, 4)] * 2, ON)
    assert seen[0] == "6xCP4+2xCP8" and seen[1] != "6xCP4+2xCP8"  # 4 + 4 >= 7


def test_long_requests_rarer_than_the_evidence_in_the_kept_windows_are_not_read() -> None:
    # One long request every 12 windows: 7 of them take 73 windows, more than are kept
    # (64 windows hold at most 6).
    sparse = [window(0.1, 0.04, 1) if i % 12 == 0 else window(0.1, 0.0, 0) for i in range(200)]
    assert set(drive(start("6xCP4+2xCP8"), sparse, ON)) == {"6xCP4+2xCP8"}
    # One every 5: 7 within 35 windows.
    dense = [window(0.1, 0.04, 1) if i % 5 == 0 else window(0.1, 0.0, 0) for i in range(60)]
    assert drive(start("6xCP4+2xCP8"), dense, ON)[-1] != "6xCP4+2xCP8"
