"""What a composition controller remembers between looks, for a shell to keep (issue 12).

:class:`vertumnus.core.control.Controller` keeps, besides the planner's
state, what its what-if check has seen and started: flaps, the last move,
streaks, small gains adding up, the last looks' gains and the goal of a
move in flight, and what the online κ learned. :class:`Memory` is that, as
one validated record: :meth:`Controller.memory` gives it, and a shell that
restarts (an operator pod rescheduled or upgraded) hands it back to the new
controller, which goes on as the old one would have. The operator stores it
in the CPPool's status (``vertumnus.operator.serialize``). Pure: no clock,
no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vertumnus.core import kappa
from vertumnus.core.types import Composition

__all__ = ["DIRECTIONS", "Look", "Memory"]

DIRECTIONS = ("split", "merge")
"""The two ways a move goes, in the order a look's gains are kept."""


@dataclass(frozen=True)
class Look:
    """One look of the what-if check as :attr:`Memory.recall` keeps it."""

    long_fraction: float
    """Long requests per request of the window it looked at."""
    merges: tuple[tuple[str, float], ...]
    """(composition, estimated mean-TTFT gain over the current one) of each merge
    candidate it estimated, by composition."""


@dataclass(frozen=True)
class Memory:
    """What a :class:`Controller` remembers besides the planner's state
    (:attr:`Controller.state`), so that a shell which restarts (an operator pod
    rescheduled or upgraded) can give it back and the controller goes on as it was:
    a pool that flaps stays damped, a move in flight keeps its goal, persistence and
    small gains keep their count, the recall its looks, the online κ what it
    learned. The window's requests are not in it: a restarted controller fills a
    new window first.
    Evaluations count the hops the controller evaluated, not the time it was down:
    flaps age only while it runs."""

    evaluations: int = 0
    """Windows evaluated so far (boundaries and flap ages are counted in them)."""
    flaps: tuple[int, ...] = ()
    """Evaluations at which a move reversed the previous one within ``flap_s``, oldest first."""
    last_move: tuple[str, int] | None = None
    """Direction and evaluation of the last move the what-if check let start."""
    streak: tuple[str, int] = ("", 0)
    """Direction of the candidate that paid in the last disjoint windows, and for how many."""
    lean: tuple[str, tuple[float, ...]] = ("", ())
    """Direction of the small gains adding up, and each window's gain."""
    looks: tuple[str, tuple[tuple[float, float], ...]] = ("", ())
    """The composition the last looks were on, and each look's best estimated gain
    toward a split and toward a merge (``PlannerSettings.whatif_agree``, and the
    merges flap damping lets through, ``damp_flaps``)."""
    recall: tuple[Look, ...] = ()
    """The last looks on the composition ``looks`` names, each with its window's long
    fraction and every merge candidate's estimated gain (``whatif_recall_s``)."""
    goal: tuple[str, Composition] | None = None
    """Direction and target of a move the what-if check started and has not finished."""
    kappa: kappa.LearnedBins | None = None
    """What the online κ learned (``PlannerSettings.learn_capacity``; None: off)."""

    def __post_init__(self) -> None:
        def direction(d: str, what: str, empty: bool) -> None:
            if d not in DIRECTIONS and not (empty and d == ""):
                raise ValueError(f"memory {what}: direction must be split or merge, got {d!r}")

        if self.evaluations < 0:
            raise ValueError(f"memory evaluations must be >= 0, got {self.evaluations}")
        flaps = list(self.flaps)
        if flaps != sorted(flaps) or any(not 0 <= f <= self.evaluations for f in flaps):
            raise ValueError(
                f"memory flaps must be ascending evaluations in 0..{self.evaluations}, "
                f"got {list(self.flaps)}"
            )
        if self.last_move is not None:
            direction(self.last_move[0], "last_move", empty=False)
            if not 0 <= self.last_move[1] <= self.evaluations:
                raise ValueError(
                    f"memory last_move: evaluation {self.last_move[1]} is not in "
                    f"0..{self.evaluations}"
                )
        direction(self.streak[0], "streak", empty=True)
        if self.streak[1] < 0:
            raise ValueError(f"memory streak count must be >= 0, got {self.streak[1]}")
        direction(self.lean[0], "lean", empty=True)
        if any(len(look) != len(DIRECTIONS) for look in self.looks[1]):
            raise ValueError(
                f"memory looks: each look is a (split, merge) pair of gains, got {self.looks[1]}"
            )
        if self.recall and not self.looks[0]:
            raise ValueError("memory recall: its looks need the composition they were on (looks)")
        for look in self.recall:
            if not 0.0 <= look.long_fraction <= 1.0:
                raise ValueError(
                    f"memory recall: a long fraction must be in [0, 1], got {look.long_fraction}"
                )
        if self.goal is not None:
            direction(self.goal[0], "goal", empty=False)

    def decisions(self) -> tuple[object, ...]:
        """What changes only when the controller decides something: the flaps, the last
        move, the streak, the lean and the goal. The rest (the evaluation count, the last
        looks, the recall, the learned κ) changes at every look; a shell that records
        every look's memory may record those parts less often, and a restart then loses
        only the looks since (``TransitionRunner.record_looks_s`` in the operator)."""
        return (self.flaps, self.last_move, self.streak, self.lean, self.goal)

    def without_plans(self) -> Memory:
        """The facts only: what happened (evaluations, flaps, the last move, the learned
        κ), not what was under way (streak, lean, looks, recall, goal) — for a controller
        whose planner state was dropped because the pool was reshaped by hand."""
        return replace(self, streak=("", 0), lean=("", ()), looks=("", ()), recall=(), goal=None)
